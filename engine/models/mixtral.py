"""Mixtral decoder-only model, as vllm/model_executor/models/mixtral.py.

Llama attention (with Mistral's sliding window when configured) and a sparse MoE block in
every layer: softmax over the router logits, top-k, always renormalized. The checkpoint's
`block_sparse_moe` is this model's `mlp` (vLLM's hf_to_vllm_mapper renames the same way);
expert weights w1/w3 (gate/up) and w2 (down) go into FusedMoE's stacked parameters.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from libvllm.engine.layers.fused_moe import FusedMoE
from libvllm.engine.layers.linear import ReplicatedLinear
from libvllm.engine.models.config import ModelArchConfig
from libvllm.engine.models.llama import LlamaDecoderLayer, LlamaForCausalLM
from libvllm.engine.models.utils import load_weights


class MixtralMoE(nn.Module):
    def __init__(self, cfg: ModelArchConfig) -> None:
        super().__init__()
        self.gate = ReplicatedLinear(cfg.hidden_size, cfg.num_experts)
        self.experts = FusedMoE(cfg.num_experts, cfg.num_experts_per_tok, cfg.hidden_size,
                                cfg.intermediate_size, renormalize=True,
                                activation=cfg.hidden_act)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # hidden_states: [num_tokens, hidden]; router logits: [num_tokens, num_experts]
        return self.experts(hidden_states, self.gate(hidden_states))


class MixtralDecoderLayer(LlamaDecoderLayer):
    def _make_mlp(self, cfg: ModelArchConfig, layer_idx: int) -> nn.Module:
        return MixtralMoE(cfg)


class MixtralForCausalLM(LlamaForCausalLM):
    layer_cls = MixtralDecoderLayer

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        mapping = FusedMoE.make_expert_params_mapping("w1", "w2", "w3", self.config.num_experts)
        mapping += FusedMoE.make_stacked_expert_params_mapping()  # GGUF
        renamed = ((n.replace(".block_sparse_moe.", ".mlp."), w) for n, w in weights)
        return load_weights(self, renamed, mapping)
