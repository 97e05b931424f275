"""Qwen3 decoder-only model, as vllm/model_executor/models/qwen3.py.

Qwen2's skeleton without the forced q/k/v bias (config.attention_bias) and with an RMSNorm
over each head of q and k before rope (q_norm / k_norm).
"""

from __future__ import annotations

from torch import nn

from libvllm.engine.layers.layernorm import RMSNorm
from libvllm.engine.models.config import ModelArchConfig
from libvllm.engine.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM


class Qwen3Attention(LlamaAttention):
    norm_cls: type[RMSNorm] = RMSNorm

    def __init__(self, cfg: ModelArchConfig, layer_idx: int, bias: bool = False,
                 bias_o_proj: bool = False) -> None:
        super().__init__(cfg, layer_idx, bias=bias, bias_o_proj=bias_o_proj)
        self.q_norm = self.norm_cls(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = self.norm_cls(self.head_dim, cfg.rms_norm_eps)

    def _qk_norm(self) -> tuple[nn.Module, nn.Module]:
        # each head of q and k, normalized by the attention layer: on CUDA inside the fused
        # RoPE + KV-cache write kernel (kernels/rotary_cache.py), else two RMSNorm calls
        return self.q_norm, self.k_norm


class Qwen3DecoderLayer(LlamaDecoderLayer):
    def _make_attn(self, cfg: ModelArchConfig, layer_idx: int) -> nn.Module:
        return Qwen3Attention(cfg, layer_idx, bias=cfg.attention_bias)


class Qwen3ForCausalLM(LlamaForCausalLM):
    layer_cls = Qwen3DecoderLayer
