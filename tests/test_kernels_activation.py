"""kernels/activation.py silu_and_mul against the engine's SiluAndMul.

Oracle: silu_and_mul_ref = engine/layers/activation.py SiluAndMul (torch). Mirrors vLLM 0.33
tests/kernels/core/test_activation.py (test_act_and_mul for SiluAndMul: token counts, odd
widths, dtypes, default tolerances). Runs on CUDA or under the Triton interpreter
(tests/test_kernels_common.py).
"""

from __future__ import annotations

import pytest
import torch
from test_kernels_common import DEVICE, DTYPES, assert_close, gpu

from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.layers.activation import SiluAndMul
from libvllm.kernels.activation import silu_and_mul, silu_and_mul_ref


@pytest.mark.parametrize("num_tokens,d", [(1, 8), (7, 37), (3, 512), (37, 768), (5, 5000)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_matches_engine(num_tokens: int, d: int, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    x = torch.randn(num_tokens, 2 * d, dtype=dtype, device=DEVICE)
    assert_close(silu_and_mul(x), silu_and_mul_ref(x))


def test_silu_and_mul_strided_rows_and_out() -> None:
    torch.manual_seed(1)
    base = torch.randn(5, 3 * 24, device=DEVICE)
    x = base[:, :48]  # rows 72 apart
    out = torch.full((5, 24), float("nan"), device=DEVICE)
    assert silu_and_mul(x, out=out) is out
    assert_close(out, silu_and_mul_ref(x))


def test_silu_and_mul_empty_batch() -> None:
    assert silu_and_mul(torch.empty(0, 16, device=DEVICE)).shape == (0, 8)


@pytest.mark.parametrize("shape,dtype,match", [
    ((4, 7), torch.float32, r"\[num_tokens, 2 \* d\]"),
    ((4, 8), torch.int32, "float32, float16 or bfloat16"),
    ((2, 4, 8), torch.float32, r"\[num_tokens, 2 \* d\]"),
])
def test_silu_and_mul_rejects_bad_input(shape, dtype, match) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        silu_and_mul(torch.zeros(shape, dtype=dtype, device=DEVICE))


@pytest.mark.parametrize("num_tokens", [1, 83, 2048])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@gpu
def test_silu_and_mul_llama_shapes(num_tokens: int, dtype: torch.dtype) -> None:
    torch.manual_seed(2)
    x = torch.randn(num_tokens, 2 * 14336, dtype=dtype, device=DEVICE)
    assert_close(silu_and_mul(x), silu_and_mul_ref(x))


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_ref_is_the_engine_torch_path(dtype: torch.dtype) -> None:
    """The kernel's plain-torch reference equals engine/layers/activation.py, bit for bit."""
    x = torch.randn(5, 2 * 37, generator=torch.Generator().manual_seed(2)).to(dtype)
    assert torch.equal(silu_and_mul_ref(x), SiluAndMul().forward_native(x))
