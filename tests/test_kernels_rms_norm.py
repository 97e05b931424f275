"""kernels/rms_norm.py rms_norm / fused_add_rms_norm against the engine's RMSNorm.

Oracle: rms_norm_ref = engine/layers/layernorm.py RMSNorm (GemmaRMSNorm for
weight_offset=1). Mirrors vLLM 0.33 tests/kernels/core/test_layernorm.py (test_rms_norm:
token counts, odd hidden sizes, add_residual, strided input, tolerance 1e-2); the in-place
contract is vLLM's fused_add_rms_norm (x <- norm, residual <- sum).
"""

from __future__ import annotations

import pytest
import torch
from test_kernels_common import DEVICE, DTYPES, gpu

from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.layers.layernorm import GemmaRMSNorm, RMSNorm
from libvllm.kernels.rms_norm import fused_add_rms_norm, rms_norm, rms_norm_ref

TOL = {"atol": 1e-2, "rtol": 1e-2}


def _inputs(n: int, h: int, dtype: torch.dtype, strided: bool, seed: int = 0):
    torch.manual_seed(seed)
    scale = 1 / (2 * h)
    x = (torch.randn(n, 2 * h if strided else h, dtype=dtype, device=DEVICE) * scale)[:, :h]
    res = torch.randn(n, h, dtype=dtype, device=DEVICE) * scale
    w = torch.empty(h, dtype=dtype, device=DEVICE).normal_(mean=1.0, std=0.1)
    return x, res, w


def _check(n: int, h: int, dtype: torch.dtype, strided: bool, offset: float) -> None:
    x, res, w = _inputs(n, h, dtype, strided)
    torch.testing.assert_close(rms_norm(x, w, 1e-6, offset), rms_norm_ref(x, w, 1e-6,
                               weight_offset=offset), **TOL)
    ref_out, ref_res = rms_norm_ref(x, w, 1e-6, res, weight_offset=offset)
    fused_add_rms_norm(x, res, w, 1e-6, offset)
    torch.testing.assert_close(x, ref_out, **TOL)
    torch.testing.assert_close(res, ref_res, **TOL)


@pytest.mark.parametrize("n,h", [(7, 8), (3, 33), (2, 768)])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("strided", [False, True])
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_rms_norm_matches_engine(n: int, h: int, dtype: torch.dtype, strided: bool,
                                 offset: float) -> None:
    _check(n, h, dtype, strided, offset)


def test_fused_add_residual_is_the_rounded_sum() -> None:
    x, res, w = _inputs(4, 64, torch.float16, False, seed=3)
    expected = x + res  # rounded to fp16 as the engine's torch add does
    fused_add_rms_norm(x, res, w, 1e-5)
    assert torch.equal(res, expected)


def test_rms_norm_rejects_bad_input() -> None:
    x = torch.zeros(2, 16, device=DEVICE)
    with pytest.raises(InvalidArgumentError, match=r"weight must be \[16\]"):
        rms_norm(x, torch.ones(8, device=DEVICE), 1e-6)
    with pytest.raises(InvalidArgumentError, match="residual must match"):
        fused_add_rms_norm(x, torch.zeros(2, 8, device=DEVICE), torch.ones(16, device=DEVICE),
                           1e-6)
    with pytest.raises(InvalidArgumentError, match="weight_offset must be 0 or 1"):
        rms_norm(x, torch.ones(16, device=DEVICE), 1e-6, 0.5)
    with pytest.raises(InvalidArgumentError, match="contiguous last dimension"):
        rms_norm(x.t(), torch.ones(2, device=DEVICE), 1e-6)


@gpu
@pytest.mark.parametrize("n", [7, 83, 4096])
@pytest.mark.parametrize("h", [769, 4096, 5125, 8192])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rms_norm_large(n: int, h: int, dtype: torch.dtype) -> None:
    _check(n, h, dtype, False, 0.0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm_cls", [RMSNorm, GemmaRMSNorm])
def test_rms_norm_ref_is_the_engine_torch_path(dtype: torch.dtype, norm_cls) -> None:
    """The kernels' plain-torch reference equals engine/layers/layernorm.py, bit for bit."""
    x, res, w = _inputs(3, 40, dtype, True, seed=5)
    norm = norm_cls(40, 1e-5)
    norm.weight.data = w
    assert torch.equal(rms_norm_ref(x, w, 1e-5, weight_offset=norm.weight_offset),
                       norm.forward_native(x))
    for got, want in zip(rms_norm_ref(x, w, 1e-5, res, norm.weight_offset),
                         norm.forward_native(x, res), strict=True):
        assert torch.equal(got, want)
