"""Routing: router logits -> (topk_weights, topk_ids) per token.

Mirrors vllm/model_executor/layers/fused_moe/router/fused_topk_router.py (fused_topk:
softmax or sigmoid scores, top-k, optional renormalize) and grouped_topk_router.py
(grouped_topk: experts in `num_expert_group` groups, the best `topk_group` groups kept,
DeepSeek's score-correction bias used for selection only, routed_scaling_factor). On
CUDA, softmax top-k is one Triton launch (kernels/moe_topk_softmax.py, upstream's
topk_softmax op); elsewhere torch ops. No host sync. Weights fp32, ids int32 as upstream.
"""

from __future__ import annotations

import torch

from libvllm.engine.errors import InvalidArgumentError


def _scores(gating_output: torch.Tensor, scoring_func: str) -> torch.Tensor:
    if scoring_func == "softmax":
        return torch.softmax(gating_output.float(), dim=-1)
    if scoring_func == "sigmoid":
        return gating_output.float().sigmoid()
    raise InvalidArgumentError(f"Unsupported scoring function: {scoring_func}")


def _check_topk(gating_output: torch.Tensor, topk: int) -> None:
    if gating_output.dim() != 2 or not 1 <= topk <= gating_output.shape[1]:
        raise InvalidArgumentError(f"top-k {topk} of router logits "
                                   f"{tuple(gating_output.shape)} is out of range")


def fused_topk(gating_output: torch.Tensor, topk: int, renormalize: bool,
               scoring_func: str = "softmax") -> tuple[torch.Tensor, torch.Tensor]:
    """gating_output [M, E] -> topk_weights [M, topk] fp32, topk_ids [M, topk] int32."""
    _check_topk(gating_output, topk)
    if gating_output.is_cuda and scoring_func == "softmax":
        from libvllm.kernels.moe_topk_softmax import topk_softmax  # lazy: triton, CUDA path only

        if gating_output.stride(1) != 1:  # the kernel takes strided rows
            gating_output = gating_output.contiguous()
        return topk_softmax(gating_output, topk, renormalize)
    topk_weights, topk_ids = _scores(gating_output, scoring_func).topk(topk, dim=-1)
    if renormalize:
        topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
    return topk_weights, topk_ids.to(torch.int32)


def grouped_topk(gating_output: torch.Tensor, topk: int, renormalize: bool,
                 num_expert_group: int, topk_group: int, scoring_func: str = "softmax",
                 routed_scaling_factor: float = 1.0,
                 e_score_correction_bias: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k among the experts of the best `topk_group` of `num_expert_group` groups.
    gating_output [M, E] (E divisible by num_expert_group), bias [E] -> as fused_topk."""
    _check_topk(gating_output, topk)
    n, e = gating_output.shape
    if num_expert_group < 1 or e % num_expert_group or not 1 <= topk_group <= num_expert_group:
        raise InvalidArgumentError(f"{e} experts do not split into {num_expert_group} groups "
                                   f"with {topk_group} kept")
    scores = _scores(gating_output, scoring_func)  # [M, E]
    original_scores = scores
    grouped = scores.view(n, num_expert_group, -1)  # [M, groups, E / groups]
    if e_score_correction_bias is not None:
        scores = scores + e_score_correction_bias.float().unsqueeze(0)
        group_scores = scores.view(n, num_expert_group, -1).topk(2, dim=-1)[0].sum(dim=-1)
    else:
        group_scores = grouped.max(dim=-1).values  # [M, groups]
    group_idx = group_scores.topk(topk_group, dim=-1, sorted=False)[1]  # [M, topk_group]
    group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)  # [M, groups]
    score_mask = group_mask.unsqueeze(-1).expand(grouped.shape).reshape(n, e)  # [M, E]
    masked = scores.masked_fill(~score_mask.bool(), float("-inf"))
    topk_ids = masked.topk(topk, dim=-1, sorted=False)[1]
    topk_weights = original_scores.gather(1, topk_ids)  # unbiased scores as weights
    if renormalize:
        topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
    if routed_scaling_factor != 1.0:
        topk_weights = topk_weights * routed_scaling_factor
    return topk_weights.float(), topk_ids.to(torch.int32)
