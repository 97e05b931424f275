"""FP8 (float8_e4m3fn) activation quantization in Triton: per token group (the block-FP8
GEMM's input) and per tensor / per token (torch._scaled_mm's and the fused MoE's inputs).

Mirrors vllm/model_executor/layers/quantization/utils/fp8_utils.py
(per_token_group_quant_fp8 and its Triton fallback _per_token_group_quant_fp8 /
_per_token_group_quant_fp8_colmajor, no UE8M0 scales) and vllm/_custom_ops.py
scaled_fp8_quant with the arithmetic of its native path
(vllm/model_executor/layers/quantization/input_quant_fp8.py QuantFP8.forward_native).

per_token_group_quant_fp8: scale = max(absmax of the group, eps) * (1 / 448), q =
clamp(x / scale, -448, 448); one program quantizes GROUPS groups of one row (upstream's
fallback launches one program per group). scaled_fp8_quant: static with a given scale
(one value, or one per row [M, 1]); dynamic per tensor ([1]) or per token ([M, 1]) with
scale = max(absmax / 448, 1 / (448 * 512)) (the absmax reductions are torch ops on the
device: no host sync), q = clamp(x * (1 / scale), -448, 448). Both clamp before the
round to FP8, so nothing saturates to NaN.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from libvllm.kernels._common import cdiv, check, check_float, next_pow2
from libvllm.kernels.launch_cache import cached_launch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
FP8_MIN_SCALING_FACTOR = 1.0 / (FP8_MAX * 512.0)  # input_quant_fp8.py's floor
GROUP_EPS = 1e-10  # per_token_group_quant_fp8's default eps


@cached_launch
@triton.jit
def _per_token_group_quant_fp8_kernel(
    y_ptr, q_ptr, s_ptr, num_groups, group_size,
    stride_ym, stride_qm, stride_sm, stride_sg, eps,
    FP8_MAX_C: tl.constexpr, BLOCK: tl.constexpr, GROUPS: tl.constexpr,
):
    # y [M, K] (last dim contiguous) -> q [M, K] fp8, s [M, K // group_size] fp32 (any
    # strides: row-major, or column-major for column_major_scales)
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)  # [GROUPS] group ids
    cols = tl.arange(0, BLOCK)
    g_mask = g < num_groups
    mask = g_mask[:, None] & (cols[None, :] < group_size)
    offs = g[:, None].to(tl.int64) * group_size + cols[None, :]  # [GROUPS, BLOCK]
    y = tl.load(y_ptr + row * stride_ym + offs, mask=mask, other=0.0).to(tl.float32)
    absmax = tl.maximum(tl.max(tl.abs(y), axis=1), eps)  # [GROUPS]
    y_s = absmax * (1.0 / FP8_MAX_C)
    y_q = tl.clamp(tl.div_rn(y, y_s[:, None]), -FP8_MAX_C, FP8_MAX_C)
    tl.store(q_ptr + row * stride_qm + offs, y_q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + row * stride_sm + g.to(tl.int64) * stride_sg, y_s, mask=g_mask)


def per_token_group_quant_fp8(x: torch.Tensor, group_size: int, eps: float = GROUP_EPS,
                              column_major_scales: bool = False, row_multiple: int = 1
                              ) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] fp32/fp16/bf16, K % group_size == 0 -> (x_q [Mp, K] float8_e4m3fn,
    x_s [Mp, K // group_size] fp32); x_s is a transposed view of a [K // group_size, Mp]
    tensor with column_major_scales (upstream's layout for column-major consumers).
    Mp is M rounded up to row_multiple (cuBLASLt's block-scaled GEMM wants its scale
    columns 16-byte aligned: 4); rows past M are left unwritten, their products unused."""
    check_float("x", x)
    check(x.dim() == 2, lambda: f"x must be [M, K], got {tuple(x.shape)}")
    check(group_size > 0 and x.shape[-1] % group_size == 0,
          lambda: f"the last dimension of `x` {x.shape[-1]} must be divisible by "
                  f"`group_size` {group_size}")
    check(x.stride(-1) == 1, "`x` groups must be contiguous")
    check(row_multiple > 0, lambda: f"row_multiple must be positive, got {row_multiple}")
    m, k = x.shape
    num_groups = k // group_size
    rows = cdiv(m, row_multiple) * row_multiple
    x_q = torch.empty((rows, k), dtype=FP8_DTYPE, device=x.device)
    if column_major_scales:
        x_s = torch.empty((num_groups, rows), dtype=torch.float32, device=x.device).t()
    else:
        x_s = torch.empty((rows, num_groups), dtype=torch.float32, device=x.device)
    if m == 0 or k == 0:
        return x_q, x_s
    block = next_pow2(group_size)
    groups = max(1, min(next_pow2(num_groups), 2048 // block))  # ~2K elements a program
    _per_token_group_quant_fp8_kernel[(m, cdiv(num_groups, groups))](
        x, x_q, x_s, num_groups, group_size,
        x.stride(0), x_q.stride(0), x_s.stride(0), x_s.stride(1), eps,
        FP8_MAX_C=FP8_MAX, BLOCK=block, GROUPS=groups,
        num_warps=min(max(block * groups // 256, 1), 8), num_stages=1,
    )
    return x_q, x_s


def per_token_group_quant_fp8_ref(x: torch.Tensor, group_size: int, eps: float = GROUP_EPS
                                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """per_token_group_quant_fp8 in torch: (x_q [M, K] fp8, x_s [M, K // group_size])."""
    m, k = x.shape
    xg = x.float().reshape(m, k // group_size, group_size)
    x_s = xg.abs().amax(dim=-1).clamp(min=eps) * (1.0 / FP8_MAX)  # [M, G]
    x_q = (xg / x_s[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return x_q.reshape(m, k), x_s


@cached_launch
@triton.jit
def _scaled_fp8_quant_kernel(
    x_ptr, q_ptr, scale_ptr, K, stride_xm, stride_qm,
    PER_ROW: tl.constexpr, FP8_MAX_C: tl.constexpr, BLOCK: tl.constexpr,
):
    # x [M, K] -> q [M, K] fp8 = clamp(x * (1 / scale)); scale [1] or [M] (PER_ROW)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < K
    if PER_ROW:
        scale = tl.load(scale_ptr + row)
    else:
        scale = tl.load(scale_ptr)
    inv = tl.div_rn(tl.full((BLOCK,), 1.0, tl.float32), scale)  # IEEE, as torch's
    x = tl.load(x_ptr + row * stride_xm + cols, mask=mask, other=0.0).to(tl.float32)
    q = tl.clamp(x * inv, -FP8_MAX_C, FP8_MAX_C)
    tl.store(q_ptr + row * stride_qm + cols, q.to(q_ptr.dtype.element_ty), mask=mask)


def _dynamic_scale(x: torch.Tensor, per_token: bool, scale_ub: torch.Tensor | None
                   ) -> torch.Tensor:
    """[M, 1] per token (absmax capped at scale_ub) or [1] per tensor, fp32."""
    if per_token:
        x_max = x.abs().amax(dim=-1, keepdim=True).float()  # [M, 1]
        if scale_ub is not None:
            x_max = x_max.clamp(max=scale_ub)
    else:
        x_max = x.abs().amax().reshape(1).float()  # [1]
    return (x_max / FP8_MAX).clamp(min=FP8_MIN_SCALING_FACTOR)


def _check_quant_args(x: torch.Tensor, scale: torch.Tensor | None,
                      scale_ub: torch.Tensor | None, per_token: bool) -> None:
    check_float("input", x)
    check(x.dim() == 2, lambda: f"input must be 2D [M, N], got {tuple(x.shape)}")
    check(scale is None or (scale.dtype == torch.float32 and scale.device == x.device and (
        scale.numel() == 1 or tuple(scale.shape) == (x.shape[0], 1))),
        lambda: "scale must be an fp32 tensor of one value or [M, 1] on the input's device, "
                f"got {None if scale is None else (tuple(scale.shape), scale.dtype)}")
    check(scale_ub is None or (scale is None and per_token and scale_ub.numel() == 1),
          "scale_ub is the dynamic per-token quantization's: one value, no scale")


def scaled_fp8_quant(input: torch.Tensor, scale: torch.Tensor | None = None,
                     num_token_padding: int | None = None,
                     scale_ub: torch.Tensor | None = None,
                     use_per_token_if_dynamic: bool = False
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """input [M, N] -> (output [max(M, num_token_padding), N] fp8, scale): static with
    `scale` (one value or [M, 1]); else dynamic, [1] per tensor or [M, 1] per token.
    Padding rows are left unwritten (upstream's torch.empty)."""
    _check_quant_args(input, scale, scale_ub, use_per_token_if_dynamic)
    m, n = input.shape
    rows = max(num_token_padding, m) if num_token_padding else m
    output = torch.empty((rows, n), dtype=FP8_DTYPE, device=input.device)
    if scale is None:
        scale = _dynamic_scale(input, use_per_token_if_dynamic, scale_ub)
    if m == 0 or n == 0:
        return output, scale
    if input.stride(-1) != 1:
        input = input.contiguous()
    block = min(4096, next_pow2(n))
    _scaled_fp8_quant_kernel[(m, cdiv(n, block))](  # scale never 0-D (Triton: a scalar)
        input, output, scale.reshape(-1), n, input.stride(0), output.stride(0),
        PER_ROW=scale.numel() != 1, FP8_MAX_C=FP8_MAX, BLOCK=block,
        num_warps=min(max(block // 512, 1), 8),
    )
    return output, scale


def scaled_fp8_quant_ref(input: torch.Tensor, scale: torch.Tensor | None = None,
                         scale_ub: torch.Tensor | None = None,
                         use_per_token_if_dynamic: bool = False
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """scaled_fp8_quant in torch (QuantFP8.forward_native), no padding."""
    if scale is None:
        scale = _dynamic_scale(input, use_per_token_if_dynamic, scale_ub)
    inv = scale.float().reshape(-1, 1).reciprocal()  # [1, 1] or [M, 1]
    out = (input.float() * inv).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return out, scale


def dequantize_fp8(x_q: torch.Tensor, scale: torch.Tensor,
                   block_shape: list[int] | None = None) -> torch.Tensor:
    """x_q [..., N, K] fp8 -> fp32 x_q * scale. block_shape [bn, bk]: scale
    [..., cdiv(N, bn), cdiv(K, bk)] (a weight's blocks; [1, bk] for per-token-group
    activations); else scale broadcast over x_q's trailing dims: one value, [..., N, 1] per
    row / channel, [E] per expert."""
    if block_shape is not None:
        n, k = x_q.shape[-2:]
        scale = scale.repeat_interleave(block_shape[0], dim=-2)[..., :n, :]
        scale = scale.repeat_interleave(block_shape[1], dim=-1)[..., :k]
    else:
        scale = scale.reshape(scale.shape + (1,) * (x_q.dim() - scale.dim()))
    return x_q.float() * scale.float()
