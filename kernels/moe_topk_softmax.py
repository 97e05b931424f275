"""Router top-k in one Triton launch: softmax over the expert logits, the k largest, and
optionally their renormalization, per token.

Mirrors vllm/model_executor/layers/fused_moe/router/fused_topk_router.py (fused_topk,
softmax scoring; upstream's op is the CUDA kernel csrc/moe/topk_softmax_kernels.cu). One
program per token holds its E logits (E <= 4096) in registers: fp32 softmax, then k
rounds of argmax-and-mask (ties go to the lowest expert id); the per-token part is the
jit helper topk_softmax_row, which kernels/fused_moe_gemv.py's routed kernels call in
their prologue. Outputs as upstream: weights
fp32 [M, k], ids int32 [M, k], in descending weight order. At decode this replaces ~6
small torch launches per MoE layer with one (launched with PDL on sm_90+).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from libvllm.kernels._common import check, check_float, compiling, pdl_launch, pdl_wait
from libvllm.kernels.launch_cache import cached_launch

MAX_EXPERTS = 4096


@triton.jit
def _topk_keys(logits_ptr, E, BLOCK_E: tl.constexpr):
    """One token's E logits (any float dtype) -> (p [BLOCK_E] = exp(x - max), the
    softmax before its division (padding: 0); key [BLOCK_E] int64)."""
    e = tl.arange(0, BLOCK_E)
    x = tl.load(logits_ptr + e, mask=e < E, other=float("-inf")).to(tl.float32)
    p = tl.exp(x - tl.max(x, 0))
    # one max picks the largest p and, among equals, the lowest id: p >= 0 orders as its
    # bits, so the key is those bits over the id's complement (padding lanes: -1, never;
    # the sign bit dropped: a NaN, of either sign, wins as in torch.topk, and every id
    # picked is a lane < E)
    bits = p.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    key = (bits.to(tl.int64) << 32) | (BLOCK_E - 1 - e)
    return p, tl.where(e < E, key, -1)


@triton.jit
def _pop_max(key, BLOCK_E: tl.constexpr):
    """The largest key: (its p (fp32), its id (int32), the keys without it)."""
    best = tl.max(key, 0)
    idx = BLOCK_E - 1 - best.to(tl.int32)  # the low 32 bits
    w = (best >> 32).to(tl.int32).to(tl.float32, bitcast=True)
    return w, idx, tl.where(tl.arange(0, BLOCK_E) == idx, -1, key)


@triton.jit
def topk_softmax_row(logits_ptr, E, TOPK: tl.constexpr, RENORMALIZE: tl.constexpr,
                     BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr):
    """One token's top-k: logits_ptr -> its E logits (any float dtype) -> (weights
    [BLOCK_K] fp32, ids [BLOCK_K] int32), slots >= TOPK zero. Shared with
    kernels/fused_moe_gemv.py, whose programs route their own token: the selection uses
    only exp(x - max) (exact whatever the launch's layout), so every kernel calling this
    picks the same experts; the weights differ by the order of one fp32 sum."""
    p, key = _topk_keys(logits_ptr, E, BLOCK_E)
    slots = tl.arange(0, BLOCK_K)
    top_w = tl.zeros((BLOCK_K,), dtype=tl.float32)
    top_i = tl.zeros((BLOCK_K,), dtype=tl.int32)
    for j in tl.static_range(TOPK):
        w, idx, key = _pop_max(key, BLOCK_E)
        top_w = tl.where(slots == j, w, top_w)
        top_i = tl.where(slots == j, idx, top_i)
    # softmax weights p / sum(p); renormalized: p / sum of the top-k's p (the same ratio
    # as upstream's softmax then renormalize, one division instead of two)
    top_w = top_w / (tl.sum(top_w, 0) if RENORMALIZE else tl.sum(p, 0))
    return top_w, top_i


@triton.jit
def topk_softmax_slot(logits_ptr, E, slot, BLOCK_E: tl.constexpr):
    """topk_softmax_row's ids[slot] (0 <= slot < top_k) alone, in slot + 1 rounds."""
    _, key = _topk_keys(logits_ptr, E, BLOCK_E)
    idx = 0
    for _ in range(0, slot + 1):
        _, idx, key = _pop_max(key, BLOCK_E)
    return idx


@cached_launch
@triton.jit
def _topk_softmax_kernel(
    logits_ptr, weights_ptr, ids_ptr, E, stride_l,
    TOPK: tl.constexpr, RENORMALIZE: tl.constexpr, BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr,
):
    # one program: one token's logits [E] -> weights, ids [TOPK]
    if USE_PDL:  # the router GEMV before wrote the logits
        pdl_wait()
    row = tl.program_id(0).to(tl.int64)
    top_w, top_i = topk_softmax_row(logits_ptr + row * stride_l, E, TOPK, RENORMALIZE,
                                    BLOCK_E, BLOCK_K)
    slots = tl.arange(0, BLOCK_K)
    tl.store(weights_ptr + row * TOPK + slots, top_w, mask=slots < TOPK)
    tl.store(ids_ptr + row * TOPK + slots, top_i, mask=slots < TOPK)


def topk_softmax(gating_output: torch.Tensor, topk: int, renormalize: bool
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """gating_output [M, E] (E <= 4096, stride-1 rows) -> (weights [M, k] fp32, ids [M, k]
    int32)."""
    check_float("gating_output", gating_output)
    check(gating_output.dim() == 2 and gating_output.stride(1) == 1,
          f"gating_output must be [M, E] with contiguous rows, got "
          f"{tuple(gating_output.shape)}")
    m, e = gating_output.shape
    check(1 <= e <= MAX_EXPERTS and 1 <= topk <= e,
          f"top-{topk} of {e} experts is out of range (E <= {MAX_EXPERTS})")
    dev = gating_output.device
    weights = torch.empty(m, topk, dtype=torch.float32, device=dev)
    # compile-only (start-up): the launch is skipped and torch ops may index with the ids
    ids = (torch.zeros if compiling() else torch.empty)(m, topk, dtype=torch.int32, device=dev)
    if m == 0:
        return weights, ids
    block_e = triton.next_power_of_2(e)
    _topk_softmax_kernel[(m,)](
        gating_output, weights, ids, e, gating_output.stride(0), TOPK=topk,
        RENORMALIZE=renormalize, BLOCK_E=block_e, BLOCK_K=triton.next_power_of_2(topk),
        num_warps=1 if block_e <= 256 else 4, **pdl_launch(gating_output),
    )
    return weights, ids


def topk_softmax_ref(gating_output: torch.Tensor, topk: int, renormalize: bool
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch form, ties to the lowest id as the kernel breaks them (a stable sort;
    without ties the experts of engine/layers/fused_moe/router.py's CPU path, torch.topk)."""
    p = torch.softmax(gating_output.float(), dim=-1)
    ids = torch.sort(p, dim=-1, descending=True, stable=True).indices[:, :topk]
    weights = p.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)
