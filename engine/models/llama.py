"""Llama (and Mistral) decoder-only model, structured as vllm/model_executor/models/llama.py.

LlamaForCausalLM = LlamaModel (embed -> decoder layers -> norm) + lm_head. Fused projections
as vLLM stacks them (qkv_proj, gate_up_proj), tensor-parallel as vLLM's (engine/layers/
linear.py: heads and the MLP's intermediate dim split by rank); Llama 3 rope scaling
and GGUF rope_freqs come through get_rope. Sliding window: per layer from `layer_types`,
else the config's `sliding_window` on every layer (Mistral), as vLLM's cache_config.sliding_window.
LlamaModel takes the decoder layer class so Qwen2/Qwen3/Mixtral reuse the skeleton, as
vLLM's LlamaModel(layer_type=...) and Qwen2Model(decoder_layer_type=...).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from libvllm.engine.layers.activation import get_act_and_mul_fn
from libvllm.engine.layers.attention import Attention, AttentionMetadata
from libvllm.engine.layers.layernorm import RMSNorm
from libvllm.engine.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
    gated_mlp,
)
from libvllm.engine.layers.logits_processor import LogitsProcessor
from libvllm.engine.layers.rotary_embedding import get_rope
from libvllm.engine.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from libvllm.engine.models.config import ModelArchConfig
from libvllm.engine.models.utils import load_weights


class LlamaMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str,
                 bias: bool = False) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2,
                                                       bias=bias)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=bias)
        self.act_fn = get_act_and_mul_fn(hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [num_tokens, hidden] -> [num_tokens, hidden]
        return gated_mlp(x, self.gate_up_proj, self.down_proj, self.act_fn)


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelArchConfig, layer_idx: int, bias: bool = False,
                 bias_o_proj: bool = False) -> None:
        super().__init__()
        hd = self.head_dim = cfg.head_dim
        self.qkv_proj = QKVParallelLinear(cfg.hidden_size, hd, cfg.num_attention_heads,
                                          cfg.num_key_value_heads, bias=bias)
        self.num_heads = self.qkv_proj.num_heads  # this rank's heads (all at tp 1)
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.q_size = self.num_heads * hd
        self.kv_size = self.num_kv_heads * hd
        self.o_proj = RowParallelLinear(cfg.num_attention_heads * hd, cfg.hidden_size,
                                        bias=bias_o_proj)
        self.rotary_emb = get_rope(hd, cfg.max_position_embeddings,
                                   cfg.layer_rope_parameters(layer_idx))
        self.attn = Attention(self.num_heads, hd, self._scaling(cfg), self.num_kv_heads,
                              per_layer_sliding_window=cfg.layer_sliding_window(layer_idx))

    def _scaling(self, cfg: ModelArchConfig) -> float:
        return self.head_dim**-0.5

    def _qk_norm(self) -> tuple[nn.Module, nn.Module] | None:
        return None  # Qwen3 / Gemma 3: the per-head (q_norm, k_norm) the attention applies

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor,
                md: AttentionMetadata) -> torch.Tensor:
        # the attention layer runs qkv_proj and applies the q/k norms and RoPE (on CUDA fused
        # with its KV-cache write; for one token without q/k norms also with the qkv GEMV)
        return self.o_proj(self.attn.forward_qkv(hidden_states, self.qkv_proj, md, positions,
                                                 self.rotary_emb, self._qk_norm()))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelArchConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = self._make_attn(cfg, layer_idx)
        self.mlp = self._make_mlp(cfg, layer_idx)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def _make_attn(self, cfg: ModelArchConfig, layer_idx: int) -> nn.Module:
        return LlamaAttention(cfg, layer_idx, bias=cfg.attention_bias,
                              bias_o_proj=cfg.attention_bias)

    def _make_mlp(self, cfg: ModelArchConfig, layer_idx: int) -> nn.Module:
        return LlamaMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act,
                        bias=cfg.mlp_bias)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor,
                residual: torch.Tensor | None, md: AttentionMetadata
                ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states, md)
        return self._mlp_block(hidden_states, residual)

    def _mlp_block(self, hidden_states: torch.Tensor, residual: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """The post-attention norm (with the residual add) and the MLP -> (mlp output, the
        new residual); Qwen3-MoE folds the norm into its router (engine/models/qwen3_moe.py)."""
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelArchConfig, layer_type: type[nn.Module] = LlamaDecoderLayer,
                 norm_type: type[RMSNorm] = RMSNorm) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(layer_type(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = norm_type(cfg.hidden_size, cfg.rms_norm_eps)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                md: AttentionMetadata) -> torch.Tensor:
        # input_ids, positions: [num_tokens] -> hidden states [num_tokens, hidden]
        hidden_states = self.embed_input_ids(input_ids)
        residual = None
        for layer in self.layers:
            hidden_states, residual = layer(positions, hidden_states, residual, md)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class LlamaForCausalLM(nn.Module):
    model_cls: type[nn.Module] = LlamaModel
    layer_cls: type[nn.Module] = LlamaDecoderLayer

    def __init__(self, cfg: ModelArchConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = self._make_model(cfg)
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size)
        if cfg.tie_word_embeddings:
            self.lm_head = self.lm_head.tie_weights(self.model.embed_tokens)
        self.logits_processor = LogitsProcessor(cfg.vocab_size)

    def _make_model(self, cfg: ModelArchConfig) -> nn.Module:
        return self.model_cls(cfg, self.layer_cls)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                md: AttentionMetadata) -> torch.Tensor:
        return self.model(input_ids, positions, md)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # [num_seqs, hidden] -> [num_seqs, vocab] in fp32
        return self.logits_processor(self.lm_head, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy HF-named tensors into parameters; every parameter must be covered."""
        return load_weights(self, weights)
