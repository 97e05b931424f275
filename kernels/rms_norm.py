"""RMSNorm and fused residual-add + RMSNorm in Triton, one program per token row.

Mirrors vllm/model_executor/layers/layernorm.py (RMSNorm.forward_cuda: ops.rms_norm and the
in-place ops.fused_add_rms_norm of csrc/layernorm_kernels.cu) with the engine's rounding
(engine/layers/layernorm.py): the residual sum is rounded to the activation dtype first,
statistics and the weight product are in fp32, the result is rounded once. weight_offset=1
gives GemmaRMSNorm's x * (1 + w). rms_norm_ref is that torch form in plain torch
(kernels/ imports nothing from engine/); tests/test_kernels_rms_norm.py checks it equals
the engine's RMSNorm / GemmaRMSNorm.forward_native.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from libvllm.kernels._common import (
    check,
    check_float,
    check_same_device,
    next_pow2,
    pdl_launch,
    pdl_wait,
)
from libvllm.kernels.launch_cache import cached_launch


@triton.jit
def rms_norm_row(x, w, hidden, eps):
    """x [BLOCK] (padding 0), w [BLOCK] fp32 (weight + weight_offset) -> x normalized in
    fp32 times w (not rounded). Shared with kernels/rms_norm_gemv.py, whose norm must equal
    this kernel's bit for bit: launch both with norm_warps' count."""
    xf = x.to(tl.float32)
    var = tl.sum(xf * xf, axis=0) / hidden
    return xf * tl.math.rsqrt(var + eps) * w


@triton.jit
def rms_norm_prologue(x_ptr, res_ptr, w_ptr, row, stride_x, stride_res, hidden, eps,
                      weight_offset, HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    """One row's norm, the prologue of rms_norm and its fused consumers (kernels/
    fp8_rms_norm_quant.py): x row [hidden] (with HAS_RESIDUAL, x + residual rounded to x's
    dtype as torch's x + r, stored back into the residual row) -> (x [BLOCK] in its dtype,
    rms_norm_row of it [BLOCK] fp32, not rounded)."""
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_res + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(res_ptr + row * stride_res + cols, x, mask=mask)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32) + weight_offset
    return x, rms_norm_row(x, w, hidden, eps)


def norm_warps(block: int) -> int:
    """Warps of a one-row norm of `block` lanes (the sum's order follows them)."""
    return min(16, max(1, block // 512))


def check_norm_weight(weight: torch.Tensor, hidden: int, weight_offset: float,
                      x: torch.Tensor, name: str = "weight") -> None:
    """weight (called `name` in the errors): a contiguous float [hidden] beside x;
    weight_offset 0 or 1."""
    check(weight.shape == (hidden,) and weight.is_contiguous(),
          lambda: f"{name} must be [{hidden}], got {tuple(weight.shape)}")
    check_float(name, weight)
    check_same_device(x=x, **{name: weight})
    check(weight_offset in (0.0, 1.0), lambda: f"weight_offset must be 0 or 1, got {weight_offset}")


def check_norm_args(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                    weight_offset: float, name: str = "x") -> tuple[int, int]:
    """The row norms' checks: x (called `name`) a float [T, H] with a contiguous last
    dimension, weight as check_norm_weight, residual None or x's shape and dtype beside
    it -> (T, H)."""
    check_float(name, x)
    check(x.dim() == 2 and x.stride(1) == 1,
          lambda: f"{name} must be [num_tokens, hidden] with a contiguous "
          f"last dimension, got {tuple(x.shape)} strides {x.stride()}")
    n, h = x.shape
    check_norm_weight(weight, h, weight_offset, x)
    if residual is not None:
        check(residual.shape == x.shape and residual.dtype == x.dtype
              and residual.stride(1) == 1, f"residual must match {name}'s shape and dtype")
        check_same_device(**{name: x, "residual": residual})
    return n, h


def norm_block(hidden: int) -> int:
    """Lanes of a one-row norm: next_pow2(hidden), at most 65536."""
    block = next_pow2(hidden)
    check(block <= 65536,
          lambda: f"hidden size {hidden} is larger than this kernel's 65536 limit")
    return block


@cached_launch
@triton.jit
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, hidden, stride_x, stride_res, stride_out, eps, weight_offset,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr,
):
    if USE_PDL:  # the kernel before wrote this one's inputs
        pdl_wait()
    # one program: one row of `hidden` values; x, res, out rows: [hidden]; w: [hidden]
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    _, y = rms_norm_prologue(x_ptr, res_ptr, w_ptr, row, stride_x, stride_res, hidden, eps,
                             weight_offset, HAS_RESIDUAL, BLOCK)
    tl.store(out_ptr + row * stride_out + cols, y.to(out_ptr.dtype.element_ty),
             mask=cols < hidden)


def _launch(x, residual, weight, out, eps, weight_offset):
    n, h = check_norm_args(x, residual, weight, weight_offset)
    if n == 0:
        return
    block = norm_block(h)
    _rms_norm_kernel[(n,)](
        x, residual if residual is not None else x, weight, out, h, x.stride(0),
        residual.stride(0) if residual is not None else 0, out.stride(0), float(eps),
        float(weight_offset),
        HAS_RESIDUAL=residual is not None, BLOCK=block,
        num_warps=norm_warps(block),
        **pdl_launch(x),
    )


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float = 0.0
) -> torch.Tensor:
    """x: [num_tokens, hidden], weight: [hidden] -> new [num_tokens, hidden] in x's dtype."""
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    _launch(x, None, weight, out, eps, weight_offset)
    return out


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
    weight_offset: float = 0.0,
) -> None:
    """In place, as vLLM's op: residual <- x + residual; x <- rms_norm(residual) * weight."""
    _launch(x, residual, weight, x, eps, weight_offset)


def rms_norm_ref(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
    weight_offset: float = 0.0,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The engine's RMSNorm / GemmaRMSNorm forward_native (engine/layers/layernorm.py) in
    torch: x [..., hidden] (+ residual, rounded to x's dtype) normalized in fp32, times
    (weight + weight_offset) in fp32, rounded once; with a residual (out, x + residual)."""
    if residual is not None:
        x = x + residual
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    out = (xf * (weight.float() + weight_offset)).to(x.dtype)
    return out if residual is None else (out, x)
