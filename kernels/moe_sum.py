"""moe_sum in Triton: the top-k partial outputs of each token summed, [M, top_k, H] -> [M, H].

Mirrors vLLM's ops.moe_sum (csrc/moe/moe_align_sum_kernels.cu moe_sum_kernel), which
fused_experts_impl (vllm/model_executor/layers/fused_moe/fused_moe.py) calls on the w2
output: one program reads a [top_k, BLOCK] slab of one token, sums it in fp32 and rounds
once to the output dtype, as torch's `x.sum(dim=1)` does for bf16/fp16. Contiguous reads of
every pair's row, where torch's reduction over the middle dimension reads strided (`python3
examples/bench/kernels.py --only moe` times both on a Qwen3-30B-A3B prefill step's
[8,192, 8, 2,048]).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from libvllm.kernels._common import cdiv, check, check_float, next_pow2, pdl_launch, pdl_wait
from libvllm.kernels.launch_cache import cached_launch

ELEMENTS = 8192  # inputs a program reads


@cached_launch
@triton.jit
def _moe_sum_kernel(
    x_ptr, out_ptr, h, top_k, stride_xm, stride_xk, stride_om,
    TOPK_PAD: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr,
):
    if USE_PDL:  # the w2 launch wrote the partials
        pdl_wait()
    # program (token, BLOCK columns): x [top_k, BLOCK] of one token -> out [BLOCK]
    tok = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ks = tl.arange(0, TOPK_PAD)
    mask = (ks < top_k)[:, None] & (cols < h)[None, :]
    x = tl.load(x_ptr + tok * stride_xm + ks[:, None] * stride_xk + cols[None, :], mask=mask,
                other=0.0)
    out = tl.sum(x.to(tl.float32), 0)
    tl.store(out_ptr + tok * stride_om + cols, out.to(out_ptr.dtype.element_ty),
             mask=cols < h)


def moe_sum(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x: [M, top_k, H] (last dimension contiguous) -> out [M, H] in x's dtype."""
    check(x.dim() == 3 and x.stride(2) == 1,
          lambda: f"x must be [num_tokens, top_k, hidden] with a contiguous last dimension, "
          f"got {tuple(x.shape)}")
    check_float("x", x)
    m, top_k, h = x.shape
    if out is None:
        out = torch.empty(m, h, dtype=x.dtype, device=x.device)
    check(out.shape == (m, h) and out.stride(1) == 1 and out.dtype == x.dtype,
          lambda: f"out must be [{m}, {h}] {x.dtype} with a contiguous last dimension")
    if m == 0 or h == 0:
        return out
    topk_pad = next_pow2(max(top_k, 1))
    block = min(next_pow2(h), max(16, ELEMENTS // topk_pad))
    _moe_sum_kernel[(m, cdiv(h, block))](
        x, out, h, top_k, x.stride(0), x.stride(1), out.stride(0), TOPK_PAD=topk_pad,
        BLOCK=block, num_warps=4, **pdl_launch(x),
    )
    return out
