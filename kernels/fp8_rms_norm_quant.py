"""RMSNorm (optionally after the residual add) fused with the per-token-group FP8 quant of
its output, one program per token row: the block-FP8 linear's input in one launch.

Mirrors vllm/_custom_ops.py rms_norm_per_block_quant (csrc/quantization/fused_kernels,
group_size [1, g], the residual updated in place: residual <- input + residual, the norm
of that) with the engine's rounding: the norm is kernels/rms_norm.py's (its row helper
and warp count, so bit-equal to rms_norm), rounded to the input's dtype, then quantized as
kernels/fp8_quant.py per_token_group_quant_fp8 quantizes (scale = max(absmax, eps) / 448
per group, IEEE division): equal to rms_norm then per_token_group_quant_fp8, one launch
and one round trip of the row fewer.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from libvllm.kernels._common import check, next_pow2, pdl_launch, pdl_wait
from libvllm.kernels.fp8_quant import FP8_DTYPE, FP8_MAX, GROUP_EPS, per_token_group_quant_fp8_ref
from libvllm.kernels.launch_cache import cached_launch
from libvllm.kernels.rms_norm import (
    check_norm_args,
    norm_block,
    norm_warps,
    rms_norm_prologue,
    rms_norm_ref,
)


@cached_launch
@triton.jit
def _rms_norm_per_block_quant_kernel(
    x_ptr, res_ptr, w_ptr, q_ptr, s_ptr, hidden, stride_x, stride_res, stride_q, stride_sm,
    stride_sg, eps, weight_offset, quant_eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, GROUP: tl.constexpr,
    FP8_MAX_C: tl.constexpr, USE_PDL: tl.constexpr,
):
    if USE_PDL:  # the kernel before wrote this one's inputs
        pdl_wait()
    # one program: one row; x, res rows: [hidden]; w: [hidden] -> q row [hidden] fp8,
    # s row [hidden / GROUP] fp32
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x, y = rms_norm_prologue(x_ptr, res_ptr, w_ptr, row, stride_x, stride_res, hidden, eps,
                             weight_offset, HAS_RESIDUAL, BLOCK)
    y = y.to(x.dtype).to(tl.float32)  # rms_norm's output
    yg = tl.reshape(y, (BLOCK // GROUP, GROUP))  # [groups, GROUP]; padding groups are 0
    y_s = tl.maximum(tl.max(tl.abs(yg), axis=1), quant_eps) * (1.0 / FP8_MAX_C)
    y_q = tl.clamp(tl.div_rn(yg, y_s[:, None]), -FP8_MAX_C, FP8_MAX_C)
    tl.store(q_ptr + row * stride_q + cols, tl.reshape(y_q, (BLOCK,)).to(
        q_ptr.dtype.element_ty), mask=mask)
    g = tl.arange(0, BLOCK // GROUP)
    tl.store(s_ptr + row * stride_sm + g * stride_sg, y_s, mask=g * GROUP < hidden)


def rms_norm_per_block_quant(input: torch.Tensor, weight: torch.Tensor, epsilon: float,
                             group_size: list[int], residual: torch.Tensor | None = None,
                             is_scale_transposed: bool = False, weight_offset: float = 0.0
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """input [T, H] float, weight [H], group_size [1, g] (g a power of two dividing H) ->
    (fp8 [T, H], fp32 scales [T, H / g], a transposed view with is_scale_transposed);
    with residual [T, H]: residual <- input + residual first, normalized in its place.
    weight_offset=1 is GemmaRMSNorm."""
    t, h = check_norm_args(input, residual, weight, weight_offset, "input")
    check(len(group_size) == 2 and group_size[0] == 1 and group_size[1] > 0
          and group_size[1] == next_pow2(group_size[1]) and h % group_size[1] == 0,
          lambda: f"group_size must be [1, g], g a power of two dividing {h}, got {group_size}")
    g = group_size[1]
    q = torch.empty((t, h), dtype=FP8_DTYPE, device=input.device)
    if is_scale_transposed:
        s = torch.empty((h // g, t), dtype=torch.float32, device=input.device).t()
    else:
        s = torch.empty((t, h // g), dtype=torch.float32, device=input.device)
    if t == 0:
        return q, s
    block = norm_block(h)  # >= g, which divides h
    _rms_norm_per_block_quant_kernel[(t,)](
        input, residual if residual is not None else input, weight, q, s, h,
        input.stride(0), residual.stride(0) if residual is not None else 0, q.stride(0),
        s.stride(0), s.stride(1), float(epsilon), float(weight_offset), GROUP_EPS,
        HAS_RESIDUAL=residual is not None, BLOCK=block, GROUP=g, FP8_MAX_C=FP8_MAX,
        num_warps=norm_warps(block), **pdl_launch(input),
    )
    return q, s


def rms_norm_per_block_quant_ref(input: torch.Tensor, weight: torch.Tensor, epsilon: float,
                                 group_size: list[int], residual: torch.Tensor | None = None,
                                 weight_offset: float = 0.0
                                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """rms_norm_ref then per_token_group_quant_fp8_ref; residual updated in place."""
    if residual is None:
        y = rms_norm_ref(input, weight, epsilon, weight_offset=weight_offset)
    else:
        y, summed = rms_norm_ref(input, weight, epsilon, residual, weight_offset)
        residual.copy_(summed)
    return per_token_group_quant_fp8_ref(y, group_size[1])
