"""kernels/gemv.py rms_norm_gemv (RMSNorm folded into the one-row GEMV) against the unfused
path: kernels/rms_norm.py rms_norm_ref (the engine's RMSNorm / GemmaRMSNorm forward_native,
with or without the fused residual add) then dense_gemv_ref (F.linear in fp32 rounded to
x's dtype).

No upstream test: vLLM has no such fusion; the references are its rms_norm /
fused_add_rms_norm (tests/kernels/core/test_layernorm.py) and kernels/gemv.py's GEMV.
Cases: with and without residual (the new residual equals x + residual, rounded, and
the inputs are left alone), weight offset 0 and 1 (GemmaRMSNorm), K a multiple of BK or
not, N not a multiple of BN, bias; on CUDA bf16 at Llama-3.1-8B's shapes. Runs on CUDA or
under the Triton interpreter (tests/test_kernels_common.py).
"""

from __future__ import annotations

import pytest
import torch
from test_kernels_common import DEVICE, DTYPES, ON_CUDA, assert_close, gpu

from engine.errors import InvalidArgumentError
from kernels.gemv import dense_gemv_ref, rms_norm_gemv
from kernels.rms_norm import fused_add_rms_norm, rms_norm, rms_norm_ref

EPS = 1e-6


def _inputs(n: int, k: int, dtype: torch.dtype, bias: bool, seed: int = 0):
    torch.manual_seed(seed)
    x = torch.randn(1, k, dtype=dtype, device=DEVICE)
    res = torch.randn(1, k, dtype=dtype, device=DEVICE)
    w = (torch.randn(n, k, device=DEVICE) / k**0.5).to(dtype)
    b = torch.randn(n, dtype=dtype, device=DEVICE) if bias else None
    norm_w = (1.0 + 0.1 * torch.randn(k, device=DEVICE)).to(dtype)
    return x, res, w, b, norm_w


def _unfused(x, res, w, b, norm_w, offset):
    """(dense_gemv_ref(rms_norm_ref(x (+ res))), the new residual)."""
    if res is None:
        return dense_gemv_ref(rms_norm_ref(x, norm_w, EPS, weight_offset=offset), w, b), x
    normed, new_res = rms_norm_ref(x, norm_w, EPS, res, offset)
    return dense_gemv_ref(normed, w, b), new_res


@pytest.mark.parametrize("n,k", [(8, 64), (37, 100), (300, 1100)])  # EVEN_K, tail, full + tail
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("offset", [0.0, 1.0])
@pytest.mark.parametrize("bias", [False, True])
def test_rms_norm_gemv_matches_norm_then_gemv(n, k, dtype, residual, offset, bias) -> None:
    x, res, w, b, norm_w = _inputs(n, k, dtype, bias)
    if not residual:
        res = None
    x0, res0 = x.clone(), None if res is None else res.clone()
    y, new_res = rms_norm_gemv(x, w, b, norm_w, EPS, offset, res)
    want_y, want_res = _unfused(x, res, w, b, norm_w, offset)
    assert y.shape == (1, n) and y.dtype == dtype
    assert_close(y, want_y)
    torch.testing.assert_close(new_res, want_res, rtol=0, atol=0)  # x + residual, rounded
    torch.testing.assert_close(x, x0, rtol=0, atol=0)  # inputs untouched (out of place)
    if residual:
        torch.testing.assert_close(res, res0, rtol=0, atol=0)
        assert new_res.data_ptr() not in (x.data_ptr(), res.data_ptr())
    else:
        assert new_res is x


def test_rms_norm_gemv_fp32_norm_weight_and_config_override() -> None:
    """A norm weight in fp32 (as RMSNorm keeps it off the model dtype) and sweep configs;
    (4, 64, 2, 1) makes the pre-pass two steps of 1024 over K = 1100, the second partial."""
    x, res, w, b, norm_w = _inputs(37, 1100, torch.float16, True, seed=1)
    want_y, _ = _unfused(x, res, w, b, norm_w.float(), 0.0)
    for config in (None, (4, 64, 2, 1), (16, 256, 4, 2)):
        y, _ = rms_norm_gemv(x, w, b, norm_w.float(), EPS, 0.0, res, config=config)
        assert_close(y, want_y)


def test_rms_norm_gemv_empty_n_still_returns_the_residual() -> None:
    x, res, w, _, norm_w = _inputs(8, 64, torch.float32, False)
    y, new_res = rms_norm_gemv(x, w[:0], None, norm_w, EPS, 0.0, res)
    assert y.shape == (1, 0)
    torch.testing.assert_close(new_res, x + res, rtol=0, atol=0)


def test_rms_norm_gemv_rejects_bad_input() -> None:
    x, res, w, _, norm_w = _inputs(8, 64, torch.float32, False)
    with pytest.raises(InvalidArgumentError, match=r"norm_weight must be a contiguous \[64\]"):
        rms_norm_gemv(x, w, None, norm_w[:32], EPS)
    with pytest.raises(InvalidArgumentError, match="norm_weight must be float32"):
        rms_norm_gemv(x, w, None, norm_w.int(), EPS)
    with pytest.raises(InvalidArgumentError, match="weight_offset must be 0 or 1"):
        rms_norm_gemv(x, w, None, norm_w, EPS, 0.5)
    with pytest.raises(InvalidArgumentError, match="residual must match"):
        rms_norm_gemv(x, w, None, norm_w, EPS, 0.0, res.half())
    with pytest.raises(InvalidArgumentError, match="residual must match"):
        rms_norm_gemv(x, w, None, norm_w, EPS, 0.0, res[:, :32])
    with pytest.raises(InvalidArgumentError, match=r"one row \[1, K\]"):
        rms_norm_gemv(torch.cat([x, x]), w, None, norm_w, EPS)
    with pytest.raises(InvalidArgumentError, match=r"contiguous \[N, 64\]"):
        rms_norm_gemv(x, w[:, :32], None, norm_w, EPS)


@gpu
@pytest.mark.parametrize("n,k", [(6144, 4096), (28672, 4096), (128256, 4096), (1000, 4000)])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_rms_norm_gemv_equals_the_unfused_kernels_bf16(n, k, residual, offset) -> None:
    """Against the CUDA kernels the layers ran before the fold: kernels/rms_norm.py then
    the GEMV's reference, within bf16 tolerance; the residual bit for bit."""
    x, res, w, _, norm_w = _inputs(n, k, torch.bfloat16, False, seed=2)
    if residual:
        y, new_res = rms_norm_gemv(x, w, None, norm_w, EPS, offset, res)
        h, r = x.clone(), res.clone()
        fused_add_rms_norm(h, r, norm_w, EPS, offset)
        torch.testing.assert_close(new_res, r, rtol=0, atol=0)
    else:
        y, _ = rms_norm_gemv(x, w, None, norm_w, EPS, offset)
        h = rms_norm(x, norm_w, EPS, offset)
    assert_close(y, dense_gemv_ref(h, w))


@pytest.mark.skipif(ON_CUDA, reason="the interpreter's bf16 rounding")
def test_rms_norm_gemv_bf16_under_the_interpreter_within_tolerance() -> None:
    """The interpreter truncates bf16 where torch rounds: the normed row may differ by an
    ulp, inside the bf16 tolerance of the output."""
    x, res, w, b, norm_w = _inputs(37, 100, torch.bfloat16, True)
    y, new_res = rms_norm_gemv(x, w, b, norm_w, EPS, 0.0, res)
    want_y, want_res = _unfused(x, res, w, b, norm_w, 0.0)
    assert_close(y, want_y, atol=2e-2, rtol=2e-2)
    assert_close(new_res, want_res, atol=1e-2, rtol=1e-2)
