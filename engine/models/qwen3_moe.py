"""Qwen3-MoE decoder-only model, as vllm/model_executor/models/qwen3_moe.py.

Qwen3 attention (q/k norms) with a sparse MoE block in the layers that
`decoder_sparse_step` / `mlp_only_layers` select, a dense MLP elsewhere. Routing: softmax
over the router logits, top-k, renormalized when `norm_topk_prob`. Batch-1 decode on CUDA
runs a sparse layer's post-attention residual add + RMSNorm and the router GEMV in one
kernel (kernels/rms_norm_gemv.py; LIBVLLM_DISABLE_NORM_ROUTER_FOLD=1 turns that off).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import torch
from torch import nn

from libvllm.engine import envs
from libvllm.engine.layers import linear
from libvllm.engine.layers.fused_moe import FusedMoE
from libvllm.engine.layers.linear import ReplicatedLinear
from libvllm.engine.models.config import ModelArchConfig
from libvllm.engine.models.llama import LlamaForCausalLM, LlamaMLP
from libvllm.engine.models.qwen3 import Qwen3DecoderLayer
from libvllm.engine.models.utils import load_weights


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


@functools.cache
def _norm_router_fold_enabled() -> bool:
    return not envs.LIBVLLM_DISABLE_NORM_ROUTER_FOLD


class Qwen3MoeDecoderLayer(Qwen3DecoderLayer):
    def _make_mlp(self, cfg: ModelArchConfig, layer_idx: int) -> nn.Module:
        sparse = (layer_idx not in cfg.mlp_only_layers and cfg.num_experts > 0
                  and (layer_idx + 1) % cfg.decoder_sparse_step == 0)
        if sparse:
            return Qwen3MoeSparseMoeBlock(cfg)
        return LlamaMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act)

    def _mlp_block(self, hidden_states: torch.Tensor, residual: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """One bf16/fp16 token on CUDA (batch-1 decode) into a sparse block with a dense
        router of at most 513 experts (no bias) and hidden <= 8192 takes the residual add,
        the RMSNorm and the router GEMV in one kernel (kernels/rms_norm_gemv.py) instead of
        kernels/rms_norm.py and kernels/gemv.py; LIBVLLM_DISABLE_NORM_ROUTER_FOLD=1 turns
        that off."""
        # hidden_states, residual: [num_tokens, hidden]
        moe, norm = self.mlp, self.post_attention_layernorm
        if (isinstance(moe, Qwen3MoeSparseMoeBlock) and moe.gate.bias is None
                and moe.gate.gguf_weight is None
                and linear._one_row_gemv(hidden_states, moe.gate.weight, None)
                and _norm_router_fold_enabled()):
            from libvllm.kernels import rms_norm_gemv  # lazy: CUDA path only

            if (moe.gate.weight.shape[0] > rms_norm_gemv.MAX_N
                    or hidden_states.shape[-1] > rms_norm_gemv.MAX_HIDDEN):
                return super()._mlp_block(hidden_states, residual)
            out, residual, router_logits = rms_norm_gemv.fused_add_rms_norm_gemv(
                hidden_states, residual, norm.weight, norm.variance_epsilon, moe.gate.weight,
                norm.weight_offset)  # [1, hidden], [1, hidden], [1, num_experts]
            return moe.experts(out, router_logits), residual
        return super()._mlp_block(hidden_states, residual)


class Qwen3MoeForCausalLM(LlamaForCausalLM):
    layer_cls = Qwen3MoeDecoderLayer

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        mapping = FusedMoE.make_expert_params_mapping("gate_proj", "down_proj", "up_proj",
                                                      self.config.num_experts)
        mapping += FusedMoE.make_stacked_expert_params_mapping()  # GGUF
        return load_weights(self, weights, mapping)
