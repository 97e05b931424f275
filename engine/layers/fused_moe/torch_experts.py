"""The torch expert paths: the host reference and the sync-free fallbacks on CUDA.

Dispatch is the sort-by-expert form of vLLM's moe_align_block_size + grouped GEMM
(vllm/model_executor/layers/fused_moe/fused_moe.py, fused_experts): the (token, slot) pairs
are sorted by expert, each expert runs one matmul over its contiguous segment, and the
weighted results are scattered back with one index_add. `fused_experts` reads the
per-expert segment sizes on the host (one sync per layer; the CPU path and every test's
oracle). On CUDA the Triton path (triton_experts.py) is the default; these two are the
fallback selected by LIBVLLM_MOE_BACKEND=torch (layer.py): in bf16,
`fused_experts_grouped` runs both expert GEMMs as torch's grouped GEMM
(torch._grouped_mm, CUTLASS on sm90) with the segment offsets found on the device; in
other dtypes `fused_experts_dense` (every expert over every token, unrouted pairs weighted
0). Neither syncs with the host, so both can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def fused_experts(hidden_states: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                  topk_weights: torch.Tensor, topk_ids: torch.Tensor, act: nn.Module
                  ) -> torch.Tensor:
    # hidden_states: [n, H]; w13: [E, 2I, H]; w2: [E, H, I]; topk_*: [n, k] -> [n, H]
    n, k = topk_ids.shape
    flat_ids = topk_ids.reshape(-1)  # [n * k]
    order = flat_ids.argsort(stable=True)  # (token, slot) pairs grouped by expert
    token_of = order // k  # [n * k] source token of each sorted pair
    x = hidden_states.index_select(0, token_of)  # [n * k, H]
    counts = torch.bincount(flat_ids, minlength=w13.shape[0]).tolist()
    out = torch.empty_like(x)
    start = 0
    for e, count in enumerate(counts):
        if count:
            seg = x[start:start + count]
            out[start:start + count] = F.linear(act(F.linear(seg, w13[e])), w2[e])
        start += count
    weights = topk_weights.reshape(-1)[order].to(out.dtype)  # [n * k]
    return torch.zeros_like(hidden_states).index_add_(0, token_of, out * weights[:, None])


def fused_experts_grouped(hidden_states: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                          topk_weights: torch.Tensor, topk_ids: torch.Tensor, act: nn.Module
                          ) -> torch.Tensor:
    """fused_experts without host syncs. Shapes as fused_experts."""
    n, k = topk_ids.shape
    flat_ids = topk_ids.reshape(-1)  # [n * k]
    sorted_ids, order = flat_ids.sort(stable=True)
    experts = torch.arange(w13.shape[0], device=flat_ids.device)
    offs = torch.searchsorted(sorted_ids, experts, right=True).to(torch.int32)  # [E] ends
    token_of = order // k
    x = hidden_states.index_select(0, token_of)  # [n * k, H]
    h = torch._grouped_mm(x, w13.transpose(1, 2), offs=offs)  # [n * k, 2I]
    out = torch._grouped_mm(act(h), w2.transpose(1, 2), offs=offs)  # [n * k, H]
    weights = topk_weights.reshape(-1)[order].to(out.dtype)  # [n * k]
    return torch.zeros_like(hidden_states).index_add_(0, token_of, out * weights[:, None])


def fused_experts_dense(hidden_states: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                        topk_weights: torch.Tensor, topk_ids: torch.Tensor, act: nn.Module
                        ) -> torch.Tensor:
    """fused_experts without host syncs for any dtype (E times the FLOPs). Shapes as
    fused_experts."""
    n, num_experts = topk_ids.shape[0], w13.shape[0]
    # [n, E] routing weight of each (token, expert); 0 where the expert is not chosen
    dense = torch.zeros(n, num_experts, dtype=torch.float32, device=topk_ids.device)
    dense.scatter_(1, topk_ids, topk_weights.float())
    out = torch.zeros_like(hidden_states)
    for e in range(num_experts):
        h = F.linear(act(F.linear(hidden_states, w13[e])), w2[e])  # [n, H]
        out += h * dense[:, e:e + 1].to(h.dtype)
    return out
