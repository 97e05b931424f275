"""The shared expert of Qwen2-MoE / Qwen3-Next: a gated MLP every token goes through, its
output scaled by sigmoid(shared_expert_gate(x)) and added to the routed experts' output.

Mirrors vllm/model_executor/models/qwen2_moe.py (Qwen2MoeMLP with `expert_gate`, passed
as `shared_experts` to FusedMoE, vLLM's SharedFusedMoE, which adds the two outputs). The
gate is owned by the MoE block (checkpoint name `mlp.shared_expert_gate`) and only
referenced here, as upstream does; the MLP's projections load as `mlp.shared_expert.*`
(gate_proj / up_proj stacked into gate_up_proj). Qwen3-Next's block passes no gate here: its
router GEMV computes the gate logit too, and FusedMoE applies it (forward's shared_gate).
"""

from __future__ import annotations

import torch
from torch import nn

from libvllm.engine.layers.activation import get_act_and_mul_fn
from libvllm.engine.layers.linear import MergedColumnParallelLinear, RowParallelLinear, gated_mlp


class SharedExpertMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str,
                 expert_gate: nn.Module | None = None) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size)
        self.act_fn = get_act_and_mul_fn(hidden_act)
        self.expert_gate = expert_gate  # ReplicatedLinear(hidden, 1) of the block, or None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [num_tokens, hidden] -> [num_tokens, hidden]
        out = gated_mlp(x, self.gate_up_proj, self.down_proj, self.act_fn)
        if self.expert_gate is not None:
            out = torch.sigmoid(self.expert_gate(x)) * out  # gate: [num_tokens, 1]
        return out
