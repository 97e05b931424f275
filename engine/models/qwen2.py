"""Qwen2 decoder-only model, as vllm/model_executor/models/qwen2.py.

Llama's op sequence with biased q/k/v projections (o_proj has none); sliding-window
layers come from `layer_types` (use_sliding_window / max_window_layers).
"""

from __future__ import annotations

from torch import nn

from libvllm.engine.models.config import ModelArchConfig
from libvllm.engine.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM


class Qwen2DecoderLayer(LlamaDecoderLayer):
    def _make_attn(self, cfg: ModelArchConfig, layer_idx: int) -> nn.Module:
        return LlamaAttention(cfg, layer_idx, bias=True, bias_o_proj=False)


class Qwen2ForCausalLM(LlamaForCausalLM):
    layer_cls = Qwen2DecoderLayer
