"""Gated RMSNorm of the Gated DeltaNet output in one Triton launch: rmsnorm(x) * w * silu(z)
per head (norm before the gate), instead of the ~12 torch kernels of its torch form.

Mirrors vllm/third_party/flash_linear_attention/ops/layernorm_guard.py (layer_norm_fwd_kernel
with is_rms_norm, NORM_BEFORE_GATE and a SiLU gate z; vLLM's RMSNormGated.forward_cuda)
with the engine's rounding, which is transformers' Qwen3NextRMSNormGated: fp32 statistics,
x * rsqrt(mean(x^2) + eps) rounded to x's dtype, times the weight rounded to x's dtype,
times silu(z) in fp32, rounded once more. rms_norm_gated_ref is that torch form (the CPU
path of engine/layers/gdn.py RMSNormGated and the kernel's test oracle). Own code.

x and z are [T, H, D] with any token and head strides (z is a view of the in-projection's
output); the output is a new contiguous [T, H * D]. One program per token, all heads.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
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


def rms_norm_gated_ref(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> torch.Tensor:
    """x, z: [..., D]; weight: [D] -> [..., D] in x's dtype (transformers' rounding)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    out = weight * xf.to(x.dtype)
    return (out * F.silu(z.float())).to(x.dtype)


@cached_launch
@triton.jit
def _rms_norm_gated_kernel(x_ptr, z_ptr, w_ptr, out_ptr, stride_xt, stride_xh, stride_zt,
                           stride_zh, stride_ot, n_heads, head_dim, eps,
                           BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
                           USE_PDL: tl.constexpr):
    if USE_PDL:  # the kernel before wrote this one's inputs
        pdl_wait()
    tok = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    m = (h < n_heads) & (d < head_dim)  # [BLOCK_H, BLOCK_D]
    x = tl.load(x_ptr + tok * stride_xt + h * stride_xh + d, mask=m, other=0.0)
    z = tl.load(z_ptr + tok * stride_zt + h * stride_zh + d, mask=m, other=0.0).to(tl.float32)
    xf = x.to(tl.float32)
    var = tl.sum(xf * xf, axis=1) / head_dim  # [BLOCK_H]
    y = (xf * tl.math.rsqrt(var + eps)[:, None]).to(x.dtype)
    w = tl.load(w_ptr + d, mask=d < head_dim, other=0.0).to(tl.float32)
    y = (y.to(tl.float32) * w).to(x.dtype)
    out = y.to(tl.float32) * (z * tl.sigmoid(z))
    tl.store(out_ptr + tok * stride_ot + h * head_dim + d, out.to(out_ptr.dtype.element_ty),
             mask=m)


def rms_norm_gated(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor,
                   eps: float) -> torch.Tensor:
    """x, z: [T, H, D] (contiguous last dimension, any other strides); weight: [D] in x's
    dtype -> new [T, H * D] in x's dtype."""
    check_float("x", x)
    check_float("z", z)
    check(x.dim() == 3 and z.shape == x.shape and x.stride(2) == 1 and z.stride(2) == 1,
          lambda: f"x and z must be [T, H, D] with a contiguous last dimension, got "
          f"{tuple(x.shape)} and {tuple(z.shape)}")
    T, H, D = x.shape
    check(weight.shape == (D,) and weight.is_contiguous() and weight.dtype == x.dtype,
          lambda: f"weight must be [{D}] {x.dtype}, got {tuple(weight.shape)} {weight.dtype}")
    check_same_device(x=x, z=z, weight=weight)
    out = torch.empty(T, H * D, dtype=x.dtype, device=x.device)
    if T == 0:
        return out
    block_h, block_d = next_pow2(H), next_pow2(D)
    check(block_h * block_d <= 65536, lambda: f"{H} heads of {D} exceed this kernel's 65536 "
          "values a token")
    _rms_norm_gated_kernel[(T,)](
        x, z, weight, out, x.stride(0), x.stride(1), z.stride(0), z.stride(1), out.stride(0),
        H, D, float(eps), BLOCK_H=block_h, BLOCK_D=block_d,
        num_warps=min(16, max(1, block_h * block_d // 512)), **pdl_launch(x))
    return out
