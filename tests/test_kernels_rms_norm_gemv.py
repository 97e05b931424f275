"""kernels/rms_norm_gemv.py (residual add + RMSNorm with the router GEMV of one token)
against the unfused kernels.

Oracles: out and residual_out equal, bit for bit, kernels/rms_norm.py fused_add_rms_norm
run on clones (the same operations in the same order); y is dense_gemv_ref (F.linear in
fp32 rounded to the dtype) of that out, tightly in fp32; fused_add_rms_norm_gemv_ref is
rms_norm_ref then dense_gemv_ref. Shapes: hidden a power of two or not, N = 1, a few, E =
128 (one row a program), 200 (two) and 513 (four, the limit); the Gemma (1 + w) form once;
the inputs untouched; bad arguments and the limits (N 514, hidden 8193). Runs on CUDA or
under the Triton interpreter (tests/test_kernels_common.py). vLLM has no such fusion, so
no upstream test is ported; the cases follow tests/test_kernels_rms_norm.py and
tests/test_kernels_gemv.py.
"""

from __future__ import annotations

import pytest
import torch
from test_kernels_common import DEVICE, DTYPES, assert_close

from libvllm.engine.errors import InvalidArgumentError
from libvllm.kernels.gemv import dense_gemv_ref
from libvllm.kernels.rms_norm import fused_add_rms_norm
from libvllm.kernels.rms_norm_gemv import fused_add_rms_norm_gemv, fused_add_rms_norm_gemv_ref

EPS = 1e-6


def _inputs(h: int, n: int, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """x, residual [1, h], norm_weight [h], w [n, h]."""
    torch.manual_seed(seed)
    x = torch.randn(1, h, dtype=dtype, device=DEVICE)
    res = torch.randn(1, h, dtype=dtype, device=DEVICE)
    nw = torch.empty(h, dtype=dtype, device=DEVICE).normal_(mean=1.0, std=0.1)
    w = (torch.randn(n, h, device=DEVICE) / h**0.5).to(dtype)
    return x, res, nw, w


def _check(h: int, n: int, dtype: torch.dtype, offset: float = 0.0) -> None:
    x, res, nw, w = _inputs(h, n, dtype)
    x0, res0 = x.clone(), res.clone()
    out, res_out, y = fused_add_rms_norm_gemv(x, res, nw, EPS, w, offset)
    assert torch.equal(x, x0) and torch.equal(res, res0)  # out of place
    want_out, want_res = x.clone(), res.clone()
    fused_add_rms_norm(want_out, want_res, nw, EPS, offset)
    assert torch.equal(out, want_out)
    assert torch.equal(res_out, want_res)
    assert y.shape == (1, n) and y.dtype == dtype
    assert_close(y, dense_gemv_ref(out, w))
    for got, want in zip(fused_add_rms_norm_gemv_ref(x, res, nw, EPS, w, offset),
                         (out, res_out, y), strict=True):
        assert_close(got, want, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("h", [64, 100])  # a power of two; a masked tail
@pytest.mark.parametrize("n", [1, 5, 128, 200, 513])  # BN 1, 1, 1, 2, 4
def test_fused_add_rms_norm_gemv_matches_unfused(h: int, n: int, dtype: torch.dtype) -> None:
    _check(h, n, dtype)


def test_fused_add_rms_norm_gemv_gemma_offset() -> None:
    _check(100, 200, torch.float32, offset=1.0)


def test_fused_add_rms_norm_gemv_rejects_bad_input() -> None:
    x, res, nw, w = _inputs(64, 514, torch.float32)
    with pytest.raises(InvalidArgumentError, match=r"w must have 1\.\.513 rows, got 514"):
        fused_add_rms_norm_gemv(x, res, nw, EPS, w)
    w = w[:8]
    two = torch.zeros(2, 64, device=DEVICE)
    with pytest.raises(InvalidArgumentError, match=r"x must be one row \[1, K\]"):
        fused_add_rms_norm_gemv(two, two, nw, EPS, w)
    with pytest.raises(InvalidArgumentError, match="w must be torch.float16 like x"):
        fused_add_rms_norm_gemv(x.half(), res.half(), nw, EPS, w)
    with pytest.raises(InvalidArgumentError, match="residual must match x's shape and dtype"):
        fused_add_rms_norm_gemv(x, res.half(), nw, EPS, w)
    with pytest.raises(InvalidArgumentError, match="w must be a contiguous"):
        fused_add_rms_norm_gemv(x, res, nw, EPS, torch.zeros(64, 8, device=DEVICE).t())
    with pytest.raises(InvalidArgumentError, match=r"norm_weight must be \[64\]"):
        fused_add_rms_norm_gemv(x, res, nw[:32], EPS, w)
    with pytest.raises(InvalidArgumentError, match="weight_offset must be 0 or 1"):
        fused_add_rms_norm_gemv(x, res, nw, EPS, w, 0.5)
    x, res, nw, w = _inputs(8193, 1, torch.float32)
    with pytest.raises(InvalidArgumentError, match="hidden size 8193 is larger"):
        fused_add_rms_norm_gemv(x, res, nw, EPS, w)
