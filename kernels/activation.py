"""SiLU-and-mul (the gated MLP activation) in Triton: out = silu(x[:, :d]) * x[:, d:].

Mirrors vllm/model_executor/layers/activation.py (SiluAndMul, whose CUDA op is
csrc/activation_kernels.cu act_and_mul_kernel). Rounding follows the engine's torch path
(engine/layers/activation.py): silu is computed in fp32 and rounded to the activation dtype,
then the product is computed in fp32 and rounded again, as torch does for bf16/fp16.
silu_and_mul_ref is that torch form in plain torch (kernels/ imports nothing from engine/);
tests/test_kernels_activation.py checks it equals the engine's SiluAndMul.forward_native.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels._common import cdiv, check, check_float, next_pow2, pdl_launch, pdl_wait


@triton.jit
def _silu_and_mul_kernel(
    x_ptr, out_ptr, d, stride_x, stride_out,
    BLOCK: tl.constexpr, USE_PDL: tl.constexpr,
):
    if USE_PDL:  # the kernel before wrote this one's inputs
        pdl_wait()
    # one program: BLOCK output columns of one token; x row: [2 * d], out row: [d]
    tok = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    a = tl.load(x_ptr + tok * stride_x + cols, mask=mask, other=0.0)
    b = tl.load(x_ptr + tok * stride_x + d + cols, mask=mask, other=0.0)
    af = a.to(tl.float32)
    silu = (af / (1.0 + tl.exp(-af))).to(a.dtype)
    out = (silu.to(tl.float32) * b.to(tl.float32)).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + tok * stride_out + cols, out, mask=mask)


def silu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x: [num_tokens, 2 * d] -> out: [num_tokens, d] in x's dtype."""
    check(x.dim() == 2 and x.shape[1] % 2 == 0, lambda: f"x must be [num_tokens, 2 * d], got "
          f"{tuple(x.shape)}")
    check_float("x", x)
    check(x.stride(1) == 1, "x's last dimension must be contiguous")
    n, d = x.shape[0], x.shape[1] // 2
    if out is None:
        out = torch.empty(n, d, dtype=x.dtype, device=x.device)
    check(out.shape == (n, d) and out.stride(1) == 1 and out.dtype == x.dtype,
          lambda: f"out must be [{n}, {d}] {x.dtype} with a contiguous last dimension")
    if n == 0:
        return out
    block = min(4096, next_pow2(d))
    _silu_and_mul_kernel[(n, cdiv(d, block))](
        x, out, d, x.stride(0), out.stride(0), BLOCK=block, num_warps=4 if block >= 1024 else 1,
        **pdl_launch(x),
    )
    return out


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """silu(x[..., :d]) * x[..., d:] in torch, as the engine's SiluAndMul.forward_native
    (engine/layers/activation.py): [n, 2d] -> [n, d]."""
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]
