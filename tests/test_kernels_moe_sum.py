"""kernels/moe_sum.py against torch's `x.sum(dim=1)`, the engine's former top-k sum.

Mirrors vLLM 0.33 tests/kernels/moe/test_moe.py::test_moe_sum (ops.moe_sum against
torch.sum(input, dim=1) over m, topk, k, dtype). Runs on CUDA or under the Triton
interpreter (tests/test_kernels_common.py).
"""

from __future__ import annotations

import pytest
import torch
from test_kernels_common import DEVICE, DTYPES, assert_close

from libvllm.engine.errors import InvalidArgumentError
from libvllm.kernels.moe_sum import moe_sum


@pytest.mark.parametrize("m,top_k,h", [(1, 1, 8), (3, 2, 37), (5, 8, 2048), (2, 6, 9000)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_moe_sum_matches_torch(m: int, top_k: int, h: int, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    x = torch.randn(m, top_k, h, dtype=dtype, device=DEVICE)
    assert_close(moe_sum(x), x.sum(dim=1))


def test_moe_sum_strided_input_and_out() -> None:
    torch.manual_seed(1)
    x = torch.randn(4, 3, 2 * 40, device=DEVICE)[:, :, :40]  # pairs 80 apart
    out = torch.full((4, 40), float("nan"), device=DEVICE)
    assert moe_sum(x, out=out) is out
    assert_close(out, x.sum(dim=1))


def test_moe_sum_empty_batch() -> None:
    assert moe_sum(torch.empty(0, 8, 16, device=DEVICE)).shape == (0, 16)


def test_moe_sum_rejects_bad_shapes() -> None:
    with pytest.raises(InvalidArgumentError, match="top_k"):
        moe_sum(torch.randn(4, 16, device=DEVICE))
    with pytest.raises(InvalidArgumentError, match="out must be"):
        moe_sum(torch.randn(2, 2, 16, device=DEVICE), out=torch.empty(2, 8, device=DEVICE))
