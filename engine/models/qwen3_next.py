"""Qwen3-Next (hybrid Gated DeltaNet + gated attention, MoE with a shared expert), as
vllm/model_executor/models/qwen3_next.py.

Layers follow config.layer_types: "linear_attention" layers run the Gated DeltaNet
(engine/layers/gdn.py), "full_attention" layers the gated attention: q_proj rows hold each
head's [q_h | gate_h], q/k zero-centred RMSNorm per head before partial NeoX RoPE, and the
attention output is scaled by sigmoid(gate) before o_proj. Every norm except the GDN's
gated one is zero-centred (GemmaRMSNorm, x * (1 + w)). The FFN is the sparse MoE block
(softmax top-k, renormalised when norm_topk_prob) plus a shared expert scaled by
sigmoid(shared_expert_gate(x)) (FusedMoE(shared_experts=SharedExpertMLP); the two gates
are one [E + 1, H] router weight, so at decode one GEMV serves both), or a dense
SwiGLU on the layers decoder_sparse_step / mlp_only_layers select. The GDN state is
hybrid-cache state (engine/worker/mamba_utils.py, engine/core/kv_cache_interface.py); `mtp.*`
weights (the multi-token-prediction head) are skipped, as vLLM's main model does.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from libvllm.engine.errors import ModelLoadError
from libvllm.engine.layers.attention import Attention, AttentionMetadata
from libvllm.engine.layers.fused_moe import FusedMoE, SharedExpertMLP
from libvllm.engine.layers.gdn import GDN_PARAMS_MAPPING, GatedDeltaNetAttention
from libvllm.engine.layers.layernorm import GemmaRMSNorm
from libvllm.engine.layers.linear import (
    MergedReplicatedLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from libvllm.engine.layers.rotary_embedding import get_rope
from libvllm.engine.models.config import ModelArchConfig
from libvllm.engine.models.llama import LlamaForCausalLM, LlamaMLP, LlamaModel
from libvllm.engine.models.utils import load_weights


class Qwen3NextAttention(nn.Module):
    def __init__(self, cfg: ModelArchConfig, layer_idx: int) -> None:
        super().__init__()
        hd = self.head_dim = cfg.head_dim
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.gated = cfg.attn_output_gate
        self.q_size = self.num_heads * hd * (2 if self.gated else 1)  # q and gate per head
        self.kv_size = self.num_kv_heads * hd
        self.qkv_proj = QKVParallelLinear(cfg.hidden_size, hd,
                                          self.num_heads * (2 if self.gated else 1),
                                          self.num_kv_heads, bias=cfg.attention_bias)
        self.o_proj = RowParallelLinear(self.num_heads * hd, cfg.hidden_size)
        self.q_norm = GemmaRMSNorm(hd, cfg.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(hd, cfg.rms_norm_eps)
        self.rotary_emb = get_rope(hd, cfg.max_position_embeddings,
                                   cfg.layer_rope_parameters(layer_idx))
        self.attn = Attention(self.num_heads, hd, hd**-0.5, self.num_kv_heads)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor,
                md: AttentionMetadata) -> torch.Tensor:
        n = hidden_states.shape[0]
        q_gate, k, v = self.qkv_proj(hidden_states).split(
            [self.q_size, self.kv_size, self.kv_size], dim=-1)
        gate = None
        if self.gated:  # [n, nq, 2 * hd]: each head's [q_h | gate_h], strided views
            q, gate = q_gate.view(n, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        else:
            q = q_gate.view(n, self.num_heads, self.head_dim)
        # the attention layer applies the q/k norms and the partial RoPE (on CUDA in its
        # KV-cache write kernel, in place in q_gate's q part) and sigmoid(gate) (on CUDA in
        # the attention kernel's store): no copies of q, k, v or the gate
        out = self.attn(q, k, v, md, positions, self.rotary_emb, (self.q_norm, self.k_norm),
                        gate)  # [n, nq * hd]
        return self.o_proj(out)


# the router and the shared expert's gate load as the rows of one weight, `mlp.gate`
# (models/utils.load_weights' (param, checkpoint, expert id, shard) form)
MOE_GATE_PARAMS_MAPPING = [
    ("mlp.gate.", "mlp.shared_expert_gate.", None, "shared_expert_gate"),
    ("mlp.gate.", "mlp.gate.", None, "gate"),
]


class Qwen3NextSparseMoeBlock(nn.Module):
    """vLLM's block; the router `gate` [E, H] and `shared_expert_gate` [1, H] are one
    [E + 1, H] weight (MOE_GATE_PARAMS_MAPPING): one GEMV gives both, and FusedMoE applies
    the shared expert's sigmoid gate (in its routed w2 launch at CUDA decode)."""

    def __init__(self, cfg: ModelArchConfig, renormalize: bool) -> None:
        super().__init__()
        h, self.num_experts = cfg.hidden_size, cfg.num_experts
        self.shared_expert = SharedExpertMLP(h, cfg.shared_expert_intermediate_size,
                                             cfg.hidden_act) \
            if cfg.shared_expert_intermediate_size else None
        shards = {"gate": cfg.num_experts}  # a shared expert's gate row only where it exists
        if self.shared_expert is not None:
            shards["shared_expert_gate"] = 1
        self.gate = MergedReplicatedLinear(h, shards)
        self.experts = FusedMoE(cfg.num_experts, cfg.num_experts_per_tok, h,
                                cfg.moe_intermediate_size, renormalize=renormalize,
                                activation=cfg.hidden_act, shared_experts=self.shared_expert)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # [n, hidden] -> [n, hidden]; logits [n, E (+ 1)]: the router's (, the shared gate's)
        logits = self.gate(hidden_states)
        e = self.num_experts
        shared_gate = logits[:, e:] if self.shared_expert is not None else None  # [n, 1]
        return self.experts(hidden_states, logits[:, :e], shared_gate)


class Qwen3NextDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelArchConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_type = cfg.layer_type(layer_idx)
        if self.layer_type == "linear_attention":
            self.linear_attn = GatedDeltaNetAttention(
                cfg.hidden_size, cfg.linear_num_key_heads, cfg.linear_num_value_heads,
                cfg.linear_key_head_dim, cfg.linear_value_head_dim,
                cfg.linear_conv_kernel_dim, cfg.rms_norm_eps)
        elif self.layer_type == "full_attention":
            self.self_attn = Qwen3NextAttention(cfg, layer_idx)
        else:
            raise ModelLoadError(f"layer {layer_idx}: layer type {self.layer_type!r} is not "
                                 "linear_attention or full_attention")
        self.mlp = self._make_mlp(cfg, layer_idx)
        self.input_layernorm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def _make_mlp(self, cfg: ModelArchConfig, layer_idx: int) -> nn.Module:
        sparse = (layer_idx not in cfg.mlp_only_layers and cfg.num_experts > 0
                  and (layer_idx + 1) % cfg.decoder_sparse_step == 0)
        if sparse:
            return Qwen3NextSparseMoeBlock(cfg, cfg.norm_topk_prob)
        return LlamaMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor,
                residual: torch.Tensor | None, md: AttentionMetadata
                ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        if self.layer_type == "linear_attention":
            hidden_states = self.linear_attn(hidden_states, md)
        else:
            hidden_states = self.self_attn(positions, hidden_states, md)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


class Qwen3NextModel(LlamaModel):
    def __init__(self, cfg: ModelArchConfig,
                 layer_type: type[nn.Module] = Qwen3NextDecoderLayer) -> None:
        super().__init__(cfg, layer_type, GemmaRMSNorm)


class Qwen3NextForCausalLM(LlamaForCausalLM):
    model_cls = Qwen3NextModel
    layer_cls = Qwen3NextDecoderLayer
    is_hybrid = True  # vLLM's IsHybrid: GDN layers keep per-request state
    skip_prefixes: tuple[str, ...] = ("mtp.",)

    def _weights(self, weights: Iterable[tuple[str, torch.Tensor]]
                 ) -> Iterable[tuple[str, torch.Tensor]]:
        """Checkpoint names as this model's (wrappers strip prefixes, split fused experts)."""
        for name, w in weights:
            if not name.startswith(self.skip_prefixes):
                yield name, w

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        n = self.config.num_experts
        mapping = list(GDN_PARAMS_MAPPING)
        if n:
            mapping += MOE_GATE_PARAMS_MAPPING
            mapping += FusedMoE.make_expert_params_mapping("gate_proj", "down_proj", "up_proj", n)
            mapping += FusedMoE.make_stacked_expert_params_mapping()
        return load_weights(self, self._weights(weights), mapping)
