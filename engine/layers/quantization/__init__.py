"""Quantized checkpoints: the config (from config.json or `quantization`), the layers it
quantizes, and the post-load step.

Mirrors vllm/model_executor/layers/quantization/__init__.py (QUANTIZATION_METHODS,
get_quantization_config), vllm/config/model.py (_verify_quantization: the checkpoint's
quant_method, its mismatch with the `quantization` argument) and
vllm/model_executor/model_loader/weight_utils.py (get_quant_config: config.json's
quantization_config, a VL model's text_config one, compression_config; `fp8` without one
is online per-tensor FP8) and base_loader.py (process_weights_after_loading after the
load). Linear layers and FusedMoE get a `quant_method` (fp8.py) unless ignored; the
routers (`mlp.gate`, `shared_expert_gate`) and the merged replicated projections (the GDN
in_proj, Qwen3-Next's router + shared gate) stay dense, as vLLM builds them with
quant_config=None: FP8 tensors for them are dequantized at load.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from libvllm.engine.errors import InvalidArgumentError, ModelLoadError
from libvllm.engine.layers.fused_moe import FusedMoE
from libvllm.engine.layers.linear import MergedReplicatedLinear, ReplicatedLinear
from libvllm.engine.layers.quantization.base_config import QuantizationConfig, WeightScheme
from libvllm.engine.layers.quantization.compressed_tensors import CompressedTensorsConfig
from libvllm.engine.layers.quantization.fp8 import (
    Fp8Config,
    Fp8LinearMethod,
    Fp8MoEMethod,
    Fp8OnlineConfig,
)

QUANTIZATION_METHODS: dict[str, type[QuantizationConfig]] = {
    "fp8": Fp8Config, "compressed-tensors": CompressedTensorsConfig}
# checkpoint shards of a fused module (vLLM's packed_modules_mapping)
PACKED_MODULES = {"qkv_proj": ["q_proj", "k_proj", "v_proj"],
                  "gate_up_proj": ["gate_proj", "up_proj"]}
_ROUTERS = ("gate", "shared_expert_gate")

__all__ = ["QUANTIZATION_METHODS", "QuantizationConfig", "WeightScheme", "apply_quant_config",
           "checkpoint_quant_method", "get_quant_config", "process_weights_after_loading"]


def _hf_quant_config(config: dict[str, Any]) -> Any:
    q = config.get("quantization_config")
    if q is None and isinstance(config.get("text_config"), dict):
        q = config["text_config"].get("quantization_config")
    return config.get("compression_config") if q is None else q


def checkpoint_quant_method(config: dict[str, Any], quantization: str | None) -> str | None:
    """The method in force: config.json's quant_method, checked against `quantization`
    (vLLM's _verify_quantization)."""
    hf = _hf_quant_config(config)
    if hf is None:
        return quantization
    if not isinstance(hf, dict) or not isinstance(hf.get("quant_method", ""), str):
        raise ModelLoadError("config.json: quantization_config must be an object with a "
                             "string quant_method")
    method = hf.get("quant_method", "").lower() or None
    if quantization is not None and method != quantization:
        raise InvalidArgumentError(
            "Quantization method specified in the model config "
            f"({method}) does not match the quantization "
            f"method specified in the `quantization` argument ({quantization}).")
    if method is not None and method not in QUANTIZATION_METHODS:
        raise ModelLoadError(f"Unknown quantization method: {method}. Must be one of "
                             f"{list(QUANTIZATION_METHODS)}.")
    return method


def get_quant_config(config: dict[str, Any], quantization: str | None
                     ) -> QuantizationConfig | None:
    """The QuantizationConfig of a checkpoint's config.json, or online FP8, or None."""
    method = checkpoint_quant_method(config, quantization)
    hf = _hf_quant_config(config)
    if hf is not None and method is not None:
        return QUANTIZATION_METHODS[method].from_config(hf)
    if method == "fp8":
        return Fp8OnlineConfig()  # vLLM: `fp8` means fp8_per_tensor online
    if method is not None:
        raise ModelLoadError(f"Cannot find the config file for {method}")
    return None


def apply_quant_config(model: nn.Module, qcfg: QuantizationConfig,
                       device: torch.device | None = None) -> None:
    """Give each quantized layer its method and its FP8 parameters (before the load), on
    `device` (default: where the layer's weight is)."""
    for prefix, module in model.named_modules():
        leaf = prefix.rpartition(".")[2]
        if isinstance(module, FusedMoE):
            if not qcfg.is_ignored(prefix):
                module.quant_method = Fp8MoEMethod(qcfg.scheme)
                module.quant_method.create_weights(module, prefix, device)
        elif isinstance(module, ReplicatedLinear) and leaf not in _ROUTERS and \
                not isinstance(module, MergedReplicatedLinear):
            if not qcfg.is_layer_skipped(prefix, PACKED_MODULES.get(leaf, [])):
                module.quant_method = Fp8LinearMethod(qcfg.scheme)
                module.quant_method.create_weights(module, prefix, device)


def process_weights_after_loading(model: nn.Module, device: torch.device) -> None:
    """Each quantized layer's post-load step: dequantized on the CPU, kept FP8 on CUDA."""
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if method is not None:
            method.process_weights_after_loading(module, device)
