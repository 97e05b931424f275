"""Llama decoder-only model, structured as vllm/model_executor/models/llama.py.

Fused projections as vLLM stacks them (qkv_proj, gate_up_proj); weights arrive as a
dict of Hugging Face names from a loader (GGUF or safetensors) via `load_weights`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.errors import ModelLoadError
from engine.layers.activation import SiluAndMul
from engine.layers.attention import Attention, AttentionMetadata
from engine.layers.layernorm import RMSNorm
from engine.layers.rotary_embedding import RotaryEmbedding
from engine.models.config import ModelArchConfig


def _param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


class LlamaMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_up_proj = _param(2 * intermediate_size, hidden_size)
        self.down_proj = _param(hidden_size, intermediate_size)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.act_fn(F.linear(x, self.gate_up_proj)), self.down_proj)


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelArchConfig) -> None:
        super().__init__()
        hd = cfg.head_dim
        self.q_size = cfg.num_attention_heads * hd
        self.kv_size = cfg.num_key_value_heads * hd
        self.qkv_proj = _param(self.q_size + 2 * self.kv_size, cfg.hidden_size)
        self.o_proj = _param(cfg.hidden_size, self.q_size)
        self.rotary_emb = RotaryEmbedding(hd, hd, cfg.max_position_embeddings, cfg.rope_theta)
        self.attn = Attention(cfg.num_attention_heads, hd, hd**-0.5, cfg.num_key_value_heads)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, md: AttentionMetadata):
        qkv = F.linear(x, self.qkv_proj)  # [num_tokens, q_size + 2 * kv_size]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        return F.linear(self.attn(q, k, v, md), self.o_proj)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelArchConfig) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(cfg)
        self.mlp = LlamaMLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, positions, hidden_states, residual, md: AttentionMetadata):
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states, md)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelArchConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = _param(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = self.embed_tokens if cfg.tie_word_embeddings else _param(
            cfg.vocab_size, cfg.hidden_size)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                md: AttentionMetadata) -> torch.Tensor:
        # input_ids, positions: [num_tokens] -> hidden states [num_tokens, hidden]
        hidden_states = F.embedding(input_ids, self.embed_tokens)
        residual = None
        for layer in self.layers:
            hidden_states, residual = layer(positions, hidden_states, residual, md)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # [num_seqs, hidden] -> [num_seqs, vocab] in fp32
        return F.linear(hidden_states, self.lm_head).float()

    # HF name -> (our parameter, shard offset in rows) for stacked parameters
    _STACKED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
                "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Copy HF-named tensors into parameters; every parameter must be covered."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for hf_name, w in weights.items():
            name = hf_name.removeprefix("model.")
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue
            parts = name.split(".")
            stacked = self._STACKED.get(parts[-2]) if len(parts) >= 2 else None
            if stacked:
                target = ".".join(parts[:-2] + [stacked[0]])
                self._copy_shard(params, target, stacked[1], w, hf_name)
            else:
                target = name if name in params else name.removesuffix(".weight")
                self._copy_full(params, target, w, hf_name)
            loaded.add(target)
        missing = set(params) - loaded
        if missing:
            raise ModelLoadError(f"checkpoint is missing weights: {sorted(missing)[:5]}")

    def _copy_full(self, params, target, w, hf_name) -> None:
        p = params.get(target)
        if p is None or p.shape != w.shape:
            want = None if p is None else tuple(p.shape)
            raise ModelLoadError(f"unexpected weight {hf_name} {tuple(w.shape)} (want {want})")
        p.data = w.to(p.dtype).contiguous()

    def _copy_shard(self, params, target, shard, w, hf_name) -> None:
        p = params.get(target)
        if p is None:
            raise ModelLoadError(f"unexpected weight {hf_name}")
        if target.endswith("qkv_proj"):
            a = self.layers[0].self_attn
            sizes = [a.q_size, a.kv_size, a.kv_size]
        else:
            sizes = [p.shape[0] // 2] * 2
        start = sum(sizes[:shard])
        if w.shape != (sizes[shard], p.shape[1]):
            raise ModelLoadError(f"weight {hf_name} has shape {tuple(w.shape)}, "
                                 f"want {(sizes[shard], p.shape[1])}")
        p.data[start:start + sizes[shard]] = w.to(p.dtype)
