"""Mixture-of-experts layer, as vllm/model_executor/layers/fused_moe/: routing (router.py),
the Triton expert path (triton_experts.py, kernels/fused_moe.py), its tuned launch
configs (config.py, configs/*.json), the torch paths (torch_experts.py), GGUF experts
(gguf_experts.py), the gated shared expert (shared_expert.py) and FusedMoE (layer.py)."""

from libvllm.engine.layers.fused_moe.config import (
    get_config,
    get_config_file_name,
    get_default_config,
    get_moe_configs,
    override_config,
    try_get_optimal_moe_config,
)
from libvllm.engine.layers.fused_moe.layer import FusedMoE, moe_backend
from libvllm.engine.layers.fused_moe.router import fused_topk, grouped_topk
from libvllm.engine.layers.fused_moe.shared_expert import SharedExpertMLP
from libvllm.engine.layers.fused_moe.torch_experts import (
    fused_experts,
    fused_experts_dense,
    fused_experts_grouped,
)
from libvllm.engine.layers.fused_moe.triton_experts import fused_experts_triton, fused_moe_triton

__all__ = ["FusedMoE", "SharedExpertMLP", "fused_experts", "fused_experts_dense",
           "fused_experts_grouped", "fused_experts_triton", "fused_moe_triton", "fused_topk",
           "get_config", "get_config_file_name", "get_default_config", "get_moe_configs",
           "grouped_topk", "moe_backend", "override_config", "try_get_optimal_moe_config"]
