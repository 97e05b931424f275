"""kernels/fp8_rms_norm_quant.py rms_norm_per_block_quant: RMSNorm (+ residual) fused with
the per-token-group FP8 quant, against the two kernels it fuses (bit for bit on CUDA) and
its torch reference.

Mirrors vLLM 0.33 tests/kernels/core/test_fused_quant_layernorm.py (rms_norm_per_block_quant
against the unfused RMSNorm then per-token-group quant, with and without residual, group
sizes 64 and 128). Under the interpreter in fp32 / fp16 (its fp32 -> fp8 store is checked
as tests/test_kernels_fp8.py assert_fp8_equal says, its bf16 rounding truncates).
"""

from __future__ import annotations

import pytest
import torch
from test_kernels_common import DEVICE, DTYPES, ON_CUDA
from test_kernels_fp8 import assert_fp8_equal

from libvllm.engine.errors import InvalidArgumentError
from libvllm.kernels.fp8_quant import per_token_group_quant_fp8
from libvllm.kernels.fp8_rms_norm_quant import (
    rms_norm_per_block_quant,
    rms_norm_per_block_quant_ref,
)
from libvllm.kernels.rms_norm import fused_add_rms_norm, rms_norm


def norm_inputs(t, h, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(t, h, generator=g) * 3).to(dtype).to(DEVICE)
    res = torch.randn(t, h, generator=g).to(dtype).to(DEVICE)
    w = (torch.rand(h, generator=g) + 0.5).to(dtype).to(DEVICE)
    return x, res, w


@pytest.mark.parametrize("t,h,group", [(1, 256, 128), (5, 192, 64), (3, 2048, 128)])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("transposed", [False, True])
def test_rms_norm_per_block_quant(t, h, group, with_residual, dtype, transposed) -> None:
    x, res, w = norm_inputs(t, h, dtype, seed=h)
    res_fused, res_ref, res_unfused = res.clone(), res.clone(), res.clone()
    q, s = rms_norm_per_block_quant(x, w, 1e-6, [1, group], res_fused if with_residual
                                    else None, is_scale_transposed=transposed)
    assert (s.t() if transposed else s).is_contiguous() and s.shape == (t, h // group)
    q_ref, s_ref = rms_norm_per_block_quant_ref(x, w, 1e-6, [1, group],
                                                res_ref if with_residual else None)
    if with_residual:  # residual <- x + residual, as fused_add_rms_norm
        torch.testing.assert_close(res_fused, res_ref, atol=0, rtol=0)
    if ON_CUDA:  # the two kernels it fuses, bit for bit
        if with_residual:
            y = x.clone()
            fused_add_rms_norm(y, res_unfused, w, 1e-6)
        else:
            y = rms_norm(x, w, 1e-6)
        q_un, s_un = per_token_group_quant_fp8(y, group)
        if dtype == torch.float32:  # no rounding of y to a narrower dtype hides the two
            # kernels' reduction orders: scales within 4 ulps, fp8 values within one step
            torch.testing.assert_close(s, s_un, rtol=5e-7, atol=0)
            assert _within_one_step(q, q_un, keep_half_steps=True)
        else:
            torch.testing.assert_close(s, s_un, atol=0, rtol=0)
            assert_fp8_equal(q, q_un)
    # the reference's norm sums in another order: its scales within the rounding of the
    # norm's output, its fp8 values within one step (away from powers of two under the
    # interpreter, assert_fp8_equal's reason)
    torch.testing.assert_close(s, s_ref, rtol=1e-2 if dtype == torch.bfloat16 else 2e-3,
                               atol=0)
    assert _within_one_step(q, q_ref, keep_half_steps=ON_CUDA)


def _within_one_step(q: torch.Tensor, q_ref: torch.Tensor, keep_half_steps: bool) -> bool:
    """Every fp8 value of q within one e4m3 step of q_ref's (values at a power of two
    skipped unless keep_half_steps)."""
    mantissa, exponent = torch.frexp(q_ref.float())
    step = torch.exp2(((exponent - 1).clamp(min=-6) - 3).float())
    keep = (mantissa.abs() != 0.5) | keep_half_steps
    return bool(((q.float() - q_ref.float()).abs() <= step)[keep].all())


def test_rms_norm_per_block_quant_errors() -> None:
    x, res, w = norm_inputs(2, 192, torch.float32)
    with pytest.raises(InvalidArgumentError, match="group_size must be"):
        rms_norm_per_block_quant(x, w, 1e-6, [1, 96])
    with pytest.raises(InvalidArgumentError, match="group_size must be"):
        rms_norm_per_block_quant(x, w, 1e-6, [128])
    with pytest.raises(InvalidArgumentError, match="residual must match"):
        rms_norm_per_block_quant(x, w, 1e-6, [1, 64], res[:1])
