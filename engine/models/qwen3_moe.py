"""Qwen3-MoE decoder-only model, as vllm/model_executor/models/qwen3_moe.py.

Qwen3 attention (q/k norms) with a sparse MoE block in the layers that
`decoder_sparse_step` / `mlp_only_layers` select, a dense MLP elsewhere. Routing: softmax
over the router logits, top-k, renormalized when `norm_topk_prob`.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from engine.layers.fused_moe import FusedMoE
from engine.layers.linear import ReplicatedLinear
from engine.models.config import ModelArchConfig
from engine.models.llama import LlamaForCausalLM, LlamaMLP
from engine.models.qwen3 import Qwen3DecoderLayer
from engine.models.utils import load_weights


class Qwen3MoeSparseMoeBlock(nn.Module):
    def __init__(self, cfg: ModelArchConfig) -> None:
        super().__init__()
        self.gate = ReplicatedLinear(cfg.hidden_size, cfg.num_experts)
        self.experts = FusedMoE(cfg.num_experts, cfg.num_experts_per_tok, cfg.hidden_size,
                                cfg.moe_intermediate_size, renormalize=cfg.norm_topk_prob,
                                activation=cfg.hidden_act)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # hidden_states: [num_tokens, hidden]; router logits: [num_tokens, num_experts]
        return self.experts(hidden_states, self.gate(hidden_states))


class Qwen3MoeDecoderLayer(Qwen3DecoderLayer):
    def _make_mlp(self, cfg: ModelArchConfig, layer_idx: int) -> nn.Module:
        sparse = (layer_idx not in cfg.mlp_only_layers and cfg.num_experts > 0
                  and (layer_idx + 1) % cfg.decoder_sparse_step == 0)
        if sparse:
            return Qwen3MoeSparseMoeBlock(cfg)
        return LlamaMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act)


class Qwen3MoeForCausalLM(LlamaForCausalLM):
    layer_cls = Qwen3MoeDecoderLayer

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        mapping = FusedMoE.make_expert_params_mapping("gate_proj", "down_proj", "up_proj",
                                                      self.config.num_experts)
        mapping += FusedMoE.make_stacked_expert_params_mapping()  # GGUF
        return load_weights(self, weights, mapping)
