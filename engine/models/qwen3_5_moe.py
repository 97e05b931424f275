"""Qwen3.5-MoE / Qwen3.6-MoE (35B-A3B, 122B-A10B, 397B-A17B), as the MoE classes of
vllm/model_executor/models/qwen3_5.py.

Qwen3.5 with the Qwen3-Next sparse MoE block (shared expert with its sigmoid gate) on
every layer; routing always renormalises the top-k weights (the config has no
norm_topk_prob). Checkpoints hold the experts fused, `mlp.experts.gate_up_proj`
[E, 2 * I, H] (gate rows, then up) and `mlp.experts.down_proj` [E, H, I] (no `.weight`
suffix); transformers' save_pretrained writes them per expert. Both load (vLLM's FusedMoE
loader accepts both, layers/fused_moe/routed_experts.py).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from libvllm.engine.models.config import ModelArchConfig
from libvllm.engine.models.qwen3_5 import Qwen3_5ForCausalLM
from libvllm.engine.models.qwen3_next import Qwen3NextDecoderLayer, Qwen3NextSparseMoeBlock


class Qwen3_5MoeDecoderLayer(Qwen3NextDecoderLayer):
    def _make_mlp(self, cfg: ModelArchConfig, layer_idx: int) -> nn.Module:
        return Qwen3NextSparseMoeBlock(cfg, renormalize=True)


class Qwen3_5MoeForCausalLM(Qwen3_5ForCausalLM):
    layer_cls = Qwen3_5MoeDecoderLayer

    def _weights(self, weights: Iterable[tuple[str, torch.Tensor]]
                 ) -> Iterable[tuple[str, torch.Tensor]]:
        for name, w in super()._weights(weights):
            if name.endswith(".experts.gate_up_proj"):  # [E, 2I, H] -> gate, up [E, I, H]
                gate, up = w.chunk(2, dim=1)
                yield name[:-len("gate_up_proj")] + "gate_proj.weight", gate
                yield name[:-len("gate_up_proj")] + "up_proj.weight", up
            elif name.endswith(".experts.down_proj"):  # [E, H, I]
                yield name + ".weight", w
            else:
                yield name, w


class Qwen3_5MoeForConditionalGeneration(Qwen3_5MoeForCausalLM):
    """The VL checkpoint's text-only path (the vision tower is not loaded)."""
