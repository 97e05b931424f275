"""moe_align_block_size in Triton: (token, slot) pairs grouped by expert, each expert's run
padded to a multiple of the GEMM's BLOCK_SIZE_M, for kernels/fused_moe.py.

Mirrors vllm/model_executor/layers/fused_moe/moe_align_block_size.py (its outputs, sizes
and padding sentinel; upstream's op is the CUDA kernel csrc/moe/moe_align_sum_kernels.cu).
One program per expert: it histograms all pair ids (tl.histogram), takes its start as the
sum of the padded counts of the experts before it, writes its pairs in token order (stable,
so deterministic), pads its run with the sentinel `numel` and writes its block's expert id.
Nothing is read back on the host, so it can be captured in a CUDA graph. Entries past
`num_tokens_post_padded` are left unwritten: the GEMM returns before reading them. Every
program scans all pairs, so past TRITON_MAX_PAIRS pairs (prefill) the sort-based torch
form runs instead (same outputs, also free of host syncs, ~15 small ops).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from libvllm.kernels._common import check
from libvllm.kernels.launch_cache import cached_launch

# pairs scanned per step by each program
_BLOCK_T = 512
# largest M * top_k aligned by the Triton kernel (decode: 512 tokens x top-8 = 4096)
TRITON_MAX_PAIRS = 8192


@cached_launch
@triton.jit(do_not_specialize=["numel"])  # a bound and a value: one variant for every M
def _moe_align_block_size_kernel(
    topk_ids_ptr, sorted_ids_ptr, expert_ids_ptr, num_post_pad_ptr, numel, num_experts,
    BLOCK_SIZE: tl.constexpr, NUM_BINS: tl.constexpr, BLOCK_T: tl.constexpr,
):
    e = tl.program_id(0)
    offs = tl.arange(0, BLOCK_T)
    bins = tl.arange(0, NUM_BINS)
    counts = tl.zeros((NUM_BINS,), dtype=tl.int32)
    for start in range(0, numel, BLOCK_T):
        # tail lanes count into bin num_experts (< NUM_BINS), dropped below
        ids = tl.load(topk_ids_ptr + start + offs, mask=start + offs < numel,
                      other=num_experts).to(tl.int32)
        counts += tl.histogram(ids, NUM_BINS)
    counts = tl.where(bins < num_experts, counts, 0)
    padded = (counts + BLOCK_SIZE - 1) // BLOCK_SIZE * BLOCK_SIZE
    run_start = tl.sum(tl.where(bins < e, padded, 0))
    count = tl.sum(tl.where(bins == e, counts, 0))
    run_end = run_start + tl.sum(tl.where(bins == e, padded, 0))
    if e == 0:
        tl.store(num_post_pad_ptr, tl.sum(padded))
    # this expert's pairs, in token order
    seen = tl.full((), 0, tl.int32)
    for start in range(0, numel, BLOCK_T):
        idx = start + offs
        ids = tl.load(topk_ids_ptr + idx, mask=idx < numel, other=num_experts)
        hit = (ids == e).to(tl.int32)
        rank = seen + tl.cumsum(hit, 0) - 1
        tl.store(sorted_ids_ptr + run_start + rank, idx, mask=hit > 0)
        seen += tl.sum(hit)
    for start in range(run_start + count, run_end, BLOCK_T):
        tl.store(sorted_ids_ptr + start + offs, numel, mask=start + offs < run_end)
    for start in range(run_start // BLOCK_SIZE, run_end // BLOCK_SIZE, BLOCK_T):
        tl.store(expert_ids_ptr + start + offs, e, mask=start + offs < run_end // BLOCK_SIZE)


def max_num_tokens_padded(numel: int, block_size: int, num_experts: int) -> int:
    """Length of sorted_token_ids, as upstream sizes it."""
    size = numel + num_experts * (block_size - 1)
    return min(numel * block_size, size) if numel < num_experts else size


def moe_align_block_size(topk_ids: torch.Tensor, block_size: int, num_experts: int
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """topk_ids [M, top_k] (ids < num_experts; not checked, that would sync) ->
    sorted_token_ids [max_padded] int32 (flat pair index, `M * top_k` = padding),
    expert_ids [cdiv(max_padded, block_size)] int32, num_tokens_post_padded [1] int32."""
    check(topk_ids.dim() == 2 and not topk_ids.dtype.is_floating_point,
          f"topk_ids must be an integer [M, top_k] tensor, got {tuple(topk_ids.shape)} "
          f"{topk_ids.dtype}")
    check(block_size >= 1 and num_experts >= 1,
          f"block_size ({block_size}) and num_experts ({num_experts}) must be >= 1")
    numel = topk_ids.numel()
    if numel > TRITON_MAX_PAIRS:
        return moe_align_block_size_ref(topk_ids, block_size, num_experts)
    size = max_num_tokens_padded(numel, block_size, num_experts)
    dev = topk_ids.device
    sorted_ids = torch.empty(size, dtype=torch.int32, device=dev)
    expert_ids = torch.empty(triton.cdiv(size, block_size), dtype=torch.int32, device=dev)
    num_post_pad = torch.zeros(1, dtype=torch.int32, device=dev)
    if numel == 0:
        return sorted_ids, expert_ids, num_post_pad
    _moe_align_block_size_kernel[(num_experts,)](
        topk_ids.contiguous(), sorted_ids, expert_ids, num_post_pad, numel, num_experts,
        BLOCK_SIZE=block_size, NUM_BINS=triton.next_power_of_2(num_experts + 1),
        BLOCK_T=_BLOCK_T, num_warps=4,
    )
    return sorted_ids, expert_ids, num_post_pad


def moe_align_block_size_ref(topk_ids: torch.Tensor, block_size: int, num_experts: int
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Torch form with the same outputs (entries past num_tokens_post_padded: sentinel / -1).
    Uses only device ops (no host sync), so it is also the engine's torch fallback."""
    flat = topk_ids.reshape(-1).long()  # [numel]
    numel, dev = flat.numel(), flat.device
    size = max_num_tokens_padded(numel, block_size, num_experts)
    counts = torch.zeros(num_experts, dtype=torch.long, device=dev).scatter_add_(
        0, flat, torch.ones_like(flat))  # [E]
    padded = (counts + block_size - 1) // block_size * block_size
    ends = padded.cumsum(0)  # [E]
    starts = ends - padded
    order = flat.argsort(stable=True)  # pairs grouped by expert, token order inside
    sorted_e = flat[order]
    first = counts.cumsum(0) - counts  # [E] index in `order` of each expert's first pair
    pos = starts[sorted_e] + torch.arange(numel, device=dev) - first[sorted_e]
    sorted_ids = torch.full((size,), numel, dtype=torch.int32, device=dev)
    sorted_ids[pos] = order.to(torch.int32)
    blocks = torch.arange(triton.cdiv(size, block_size), device=dev) * block_size
    expert_ids = torch.searchsorted(ends, blocks, right=True)
    expert_ids = torch.where(expert_ids < num_experts, expert_ids, -1).to(torch.int32)
    return sorted_ids, expert_ids, ends[-1:].to(torch.int32)
