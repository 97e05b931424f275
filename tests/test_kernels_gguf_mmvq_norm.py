"""kernels/gguf_mmvq.py rms_norm_quantize_q8_1 (the (fused add +) RMSNorm folded into the
q8_1 quantization of the GGUF decode GEMV) and its wiring in engine/layers/linear.py
(GGUFWeight.forward_rms_norm through ReplicatedLinear.forward_rms_norm).

No upstream test: vLLM has no such fusion. Oracle: kernels/rms_norm.py rms_norm_ref (the
engine's RMSNorm / GemmaRMSNorm forward_native, with or without the residual add) then
quantize_q8_1, equal up to the fp32 summation order of the mean square (a q8_1 value may
move by one); the new residual bit for bit. Cases: 1 and 3 tokens, residual or not,
weight offset 0 and 1, K in one partial pre-pass step or two, a strided residual;
the layer folds only where every shard runs the int8 GEMV and up to MMVQ_MAX_M tokens.
Runs on CUDA or under the Triton interpreter (tests/test_kernels_common.py).
"""

from __future__ import annotations

import pytest
import torch
from test_kernels_common import DEVICE, DTYPES
from test_kernels_gguf_gemm import random_weight

import engine.layers.linear as linear
from engine.errors import InvalidArgumentError
from engine.gguf.constants import GGMLType
from engine.layers.layernorm import GemmaRMSNorm, RMSNorm
from engine.layers.linear import GGUFWeight, ReplicatedLinear
from kernels.gguf_mmvq import MMVQ_MAX_M, quantize_q8_1, rms_norm_quantize_q8_1
from kernels.rms_norm import rms_norm_ref

EPS = 1e-6


def _close_q8_1(got, want) -> None:
    """Equal but where the mean square's summation order moved a normalized value by an
    ulp of the activation dtype (rare): one q8_1 step, a scale or a sum by that ulp."""
    (xq, xd, xs), (wq, wd, ws) = got, want
    diff = (xq.view(torch.int8).int() - wq.view(torch.int8).int()).abs()
    assert int(diff.max()) <= 1 and int(diff.sum()) <= 4
    torch.testing.assert_close(xd, wd, rtol=1e-2, atol=0)
    torch.testing.assert_close(xs, ws, rtol=1e-4, atol=2e-2)


@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("k", [96, 640])  # one partial step; a full 512-wide step + a tail
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_rms_norm_quantize_q8_1_matches_norm_then_quantize(m, k, dtype, residual, offset
                                                           ) -> None:
    torch.manual_seed(0)
    x = torch.randn(m, k, device=DEVICE).to(dtype) * 3
    # rows strided
    res = torch.randn(m, k + 8, device=DEVICE).to(dtype)[:, :k] if residual else None
    nw = (1.0 + 0.1 * torch.randn(k, device=DEVICE)).to(dtype)
    x0 = x.clone()
    got, new_res = rms_norm_quantize_q8_1(x, nw, EPS, offset, res)
    if res is None:
        normed, want_res = rms_norm_ref(x, nw, EPS, weight_offset=offset), x
        assert new_res is x
    else:
        normed, want_res = rms_norm_ref(x, nw, EPS, res, offset)
        assert new_res.data_ptr() != res.data_ptr() and new_res.is_contiguous()
    _close_q8_1(got, quantize_q8_1(normed))
    torch.testing.assert_close(new_res, want_res, rtol=0, atol=0)
    torch.testing.assert_close(x, x0, rtol=0, atol=0)


def test_rms_norm_quantize_q8_1_pre_pass_in_two_steps() -> None:
    """A row wider than the pre-pass step (8192): two steps, the second partial."""
    torch.manual_seed(1)
    x, res = torch.randn(2, 8256, device=DEVICE), torch.randn(2, 8256, device=DEVICE)
    nw = torch.rand(8256, device=DEVICE) + 0.5
    got, new_res = rms_norm_quantize_q8_1(x, nw, EPS, 0.0, res)
    normed, want_res = rms_norm_ref(x, nw, EPS, res)
    _close_q8_1(got, quantize_q8_1(normed))
    torch.testing.assert_close(new_res, want_res, rtol=0, atol=0)


def test_rms_norm_quantize_q8_1_rejects_bad_input() -> None:
    x = torch.randn(2, 64, device=DEVICE)
    nw = torch.ones(64, device=DEVICE)
    with pytest.raises(InvalidArgumentError, match=r"norm_weight must be a contiguous \[64\]"):
        rms_norm_quantize_q8_1(x, nw[:32], EPS)
    with pytest.raises(InvalidArgumentError, match="weight_offset must be 0 or 1"):
        rms_norm_quantize_q8_1(x, nw, EPS, 2.0)
    with pytest.raises(InvalidArgumentError, match="residual must match"):
        rms_norm_quantize_q8_1(x, nw, EPS, 0.0, x[:1])
    with pytest.raises(InvalidArgumentError, match="multiple of 32"):
        rms_norm_quantize_q8_1(x[:, :40], nw[:40], EPS)
    with pytest.raises(InvalidArgumentError, match="last dim contiguous"):
        rms_norm_quantize_q8_1(torch.randn(2, 128, device=DEVICE)[:, ::2], nw, EPS)


@pytest.fixture
def fold_on(monkeypatch):
    monkeypatch.delenv("LIBVLLM_DISABLE_NORM_FOLD", raising=False)
    linear._norm_fold_enabled.cache_clear()
    yield
    linear._norm_fold_enabled.cache_clear()


@pytest.mark.parametrize("norm_cls", [RMSNorm, GemmaRMSNorm])
def test_gguf_projection_folds_its_norm(norm_cls, fold_on, monkeypatch) -> None:
    """A qkv-like layer of int8-dot shards (Q4_K, Q6_K) with a bias: up to MMVQ_MAX_M rows
    the norm goes into the quantization, equal to norm then the layer; with a shard of
    another type (Q5_0) or more rows, the norm runs first, as before."""
    calls = []
    real = rms_norm_quantize_q8_1
    monkeypatch.setattr("kernels.gguf_mmvq.rms_norm_quantize_q8_1",
                        lambda *a: calls.append(a[0].shape[0]) or real(*a))
    norm = norm_cls(256).to(DEVICE)
    norm.weight.data.uniform_(0.5, 1.5)
    gen = torch.Generator().manual_seed(3)
    for types, rows, folds in (((GGMLType.Q4_K, GGMLType.Q6_K), 3, True),
                               ((GGMLType.Q4_K, GGMLType.Q6_K), MMVQ_MAX_M + 1, False),
                               ((GGMLType.Q4_K, GGMLType.Q5_0), 1, False)):
        lin = ReplicatedLinear(256, 14, bias=True).to(DEVICE)
        lin.bias.data.normal_()
        lin.weight = None
        lin.gguf_weight = GGUFWeight([(random_weight(t, n, 256, seed=i), t)
                                      for i, (t, n) in enumerate(zip(types, (8, 6)))])
        calls.clear()
        for residual in (False, True):
            x = torch.randn(rows, 256, generator=gen).to(DEVICE)
            res = torch.randn(rows, 256, generator=gen).to(DEVICE) if residual else None
            want_x, want_res = norm.forward_native(x, res) if residual else (norm(x), x)
            want = lin(want_x)
            y, new_res = lin.forward_rms_norm(x.clone(), None if res is None else res.clone(),
                                              norm)
            torch.testing.assert_close(y, want, rtol=2e-2, atol=2e-2 * float(want.abs().max()))
            torch.testing.assert_close(new_res, want_res, rtol=0, atol=0)
        assert calls == ([rows, rows] if folds else [])
