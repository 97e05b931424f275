"""Mixture-of-experts layer: top-k routing and expert dispatch (torch reference).

Mirrors vllm/model_executor/layers/fused_moe/{layer.py (FusedMoE, its w13/w2 stacked
expert weights and make_expert_params_mapping), router/fused_topk_router.py (fused_topk)}.
Dispatch is the sort-by-expert form of vLLM's moe_align_block_size + grouped GEMM: the
(token, slot) pairs are sorted by expert, each expert runs one matmul over its contiguous
segment, and the weighted results are scattered back with one index_add. There is no loop
over tokens. On the host the per-expert segment sizes are read (one sync per layer); on CUDA
in bf16, `fused_experts_grouped` runs both expert GEMMs as torch's grouped GEMM
(torch._grouped_mm, CUTLASS on sm90) with the segment offsets found on the device, so
the layer has no host sync and can be captured in a CUDA graph; in other dtypes on CUDA,
`fused_experts_dense` (every expert over every token, unrouted pairs weighted 0) is the
sync-free fallback.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.errors import ModelLoadError
from engine.layers.activation import get_act_and_mul_fn


def fused_topk(gating_output: torch.Tensor, topk: int, renormalize: bool
               ) -> tuple[torch.Tensor, torch.Tensor]:
    # gating_output: [num_tokens, num_experts] -> weights [num_tokens, topk] fp32, ids int64
    probs = torch.softmax(gating_output.float(), dim=-1)
    topk_weights, topk_ids = probs.topk(topk, dim=-1)
    if renormalize:
        topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
    return topk_weights, topk_ids


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


class FusedMoE(nn.Module):
    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int,
                 renormalize: bool = True, activation: str = "silu") -> None:
        super().__init__()
        self.num_experts = num_experts
        self.top_k = top_k
        self.intermediate_size = intermediate_size
        self.renormalize = renormalize
        self.act = get_act_and_mul_fn(activation)
        self.w13_weight = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size,
                                                   hidden_size), requires_grad=False)
        self.w2_weight = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size),
                                      requires_grad=False)
        self.w13_weight.weight_loader = self.weight_loader
        self.w2_weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, weight_name: str,
                      shard_id: str, expert_id: int) -> None:
        """One expert's w1 (gate), w3 (up) or w2 (down) into the stacked parameter."""
        i = self.intermediate_size
        rows = {"w1": slice(0, i), "w3": slice(i, 2 * i), "w2": slice(None)}[shard_id]
        dst = param.data[expert_id, rows]
        if tuple(loaded.shape) != tuple(dst.shape):
            raise ModelLoadError(f"{weight_name} has shape {tuple(loaded.shape)}, "
                                 f"want {tuple(dst.shape)}")
        dst.copy_(loaded.to(param.dtype))

    def forward(self, hidden_states: torch.Tensor, router_logits: torch.Tensor
                ) -> torch.Tensor:
        # hidden_states: [n, H]; router_logits: [n, E] -> [n, H]
        topk_weights, topk_ids = fused_topk(router_logits, self.top_k, self.renormalize)
        experts = fused_experts
        if hidden_states.is_cuda:
            experts = fused_experts_grouped if hidden_states.dtype == torch.bfloat16 \
                else fused_experts_dense
        return experts(hidden_states, self.w13_weight, self.w2_weight, topk_weights,
                             topk_ids, self.act)

    @staticmethod
    def make_expert_params_mapping(ckpt_gate_proj_name: str, ckpt_down_proj_name: str,
                                   ckpt_up_proj_name: str, num_experts: int
                                   ) -> list[tuple[str, str, int, str]]:
        """(param_name, checkpoint name fragment, expert_id, shard_id) for every expert."""
        shards = [("w1", ckpt_gate_proj_name), ("w2", ckpt_down_proj_name),
                  ("w3", ckpt_up_proj_name)]
        return [("experts.w13_" if shard_id in ("w1", "w3") else "experts.w2_",
                 f"experts.{expert_id}.{name}.", expert_id, shard_id)
                for expert_id in range(num_experts) for shard_id, name in shards]
