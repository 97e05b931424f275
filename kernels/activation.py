"""SiLU-and-mul (the gated MLP activation) in Triton: out = silu(x[:, :d]) * x[:, d:].

A program writes up to ELEMENTS outputs: a slice of one wide row (dense MLPs, d of 8k to
14k) or several whole narrow rows (the MoE's per-pair rows, d of 512 or 768, where a
program per row moved 4.6 KB: [65,536, 1,536] pairs in a Qwen3-30B-A3B prefill step).

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

from libvllm.kernels._common import cdiv, check, check_float, next_pow2, pdl_launch, pdl_wait
from libvllm.kernels.launch_cache import cached_launch

ELEMENTS = 4096  # outputs a program writes: narrow rows (MoE, d = 512 / 768) share one


@cached_launch
@triton.jit
def _silu_and_mul_kernel(
    x_ptr, out_ptr, n, d, stride_x, stride_out,
    ROWS: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr,
):
    if USE_PDL:  # the kernel before wrote this one's inputs
        pdl_wait()
    # one program: BLOCK output columns of ROWS tokens; x row: [2 * d], out row: [d]
    tok = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)  # [ROWS]
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK]
    mask = (tok < n)[:, None] & (cols < d)[None, :]
    src = x_ptr + tok[:, None] * stride_x + cols[None, :]
    a = tl.load(src, mask=mask, other=0.0)
    b = tl.load(src + d, mask=mask, other=0.0)
    af = a.to(tl.float32)
    silu = (af / (1.0 + tl.exp(-af))).to(a.dtype)
    out = (silu.to(tl.float32) * b.to(tl.float32)).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + tok[:, None] * stride_out + cols[None, :], out, mask=mask)


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
    block = min(ELEMENTS, next_pow2(d))
    rows = min(ELEMENTS // block, next_pow2(n))  # [rows, block] a program
    _silu_and_mul_kernel[(cdiv(n, rows), cdiv(d, block))](
        x, out, n, d, x.stride(0), out.stride(0), ROWS=rows, BLOCK=block,
        num_warps=4 if rows * block >= 1024 else 1, **pdl_launch(x),
    )
    return out


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """silu(x[..., :d]) * x[..., d:] in torch, as the engine's SiluAndMul.forward_native
    (engine/layers/activation.py): [n, 2d] -> [n, d]."""
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]
