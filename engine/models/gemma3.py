"""Gemma 3 (text) decoder-only model, as vllm/model_executor/models/gemma3.py.

Differences from Llama, each in its place: embeddings scaled by sqrt(hidden_size) (in the
model dtype); GemmaRMSNorm (x * (1 + w)) everywhere, including per-head q/k norms; four
norms per layer (input, post-attention, pre-feedforward, post-feedforward); attention scale
query_pre_attn_scalar ** -0.5; sliding and global layers (`layer_types`) with their own
rope parameters; gelu-tanh MLP; tied LM head; optional final logit soft cap.
"""

from __future__ import annotations

import torch
from torch import nn

from libvllm.engine.layers.attention import AttentionMetadata
from libvllm.engine.layers.layernorm import GemmaRMSNorm
from libvllm.engine.layers.logits_processor import LogitsProcessor
from libvllm.engine.models.config import ModelArchConfig
from libvllm.engine.models.llama import LlamaForCausalLM, LlamaMLP, LlamaModel
from libvllm.engine.models.qwen3 import Qwen3Attention


class Gemma3Attention(Qwen3Attention):
    norm_cls = GemmaRMSNorm

    def _scaling(self, cfg: ModelArchConfig) -> float:
        return (cfg.query_pre_attn_scalar or self.head_dim) ** -0.5


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelArchConfig, layer_idx: int) -> None:
        super().__init__()
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.self_attn = Gemma3Attention(cfg, layer_idx, bias=cfg.attention_bias,
                                          bias_o_proj=cfg.attention_bias)
        self.mlp = LlamaMLP(h, cfg.intermediate_size, cfg.hidden_act)
        self.input_layernorm = GemmaRMSNorm(h, eps)
        self.post_attention_layernorm = GemmaRMSNorm(h, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(h, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(h, eps)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor,
                residual: torch.Tensor | None, md: AttentionMetadata
                ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states, md)
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states, residual = self.pre_feedforward_layernorm(hidden_states, residual)
        hidden_states = self.mlp(hidden_states)
        return self.post_feedforward_layernorm(hidden_states), residual


class Gemma3Model(LlamaModel):
    def __init__(self, cfg: ModelArchConfig, layer_type: type[nn.Module] = Gemma3DecoderLayer
                 ) -> None:
        super().__init__(cfg, layer_type, GemmaRMSNorm)
        # a buffer so that it is rounded to the model dtype, as the reference does
        self.register_buffer("normalizer", torch.tensor(cfg.hidden_size**0.5), persistent=False)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids) * self.normalizer


class Gemma3ForCausalLM(LlamaForCausalLM):
    model_cls = Gemma3Model
    layer_cls = Gemma3DecoderLayer

    def __init__(self, cfg: ModelArchConfig) -> None:
        super().__init__(cfg)
        self.logits_processor = LogitsProcessor(cfg.vocab_size, cfg.final_logit_softcapping)
