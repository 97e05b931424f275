"""Hugging Face directory (config.json + safetensors) -> model, as
vllm/model_executor/model_loader/default_loader.py (DefaultModelLoader).

architectures in config.json select the model class through the registry (never code from
the directory: auto_map is ignored); generation_config.json is read into
ModelArchConfig.generation_config for the engine's default sampling parameters.
config.json's quantization_config (vllm/model_executor/model_loader/weight_utils.py
get_quant_config, engine/layers/quantization/) quantizes the model's layers before the
load (apply_quant_config; the dense weights those layers replace are built on the meta
device, never allocated); the fp8 tensors come with their scales
(engine/model_loader/fp8_weights.py), and process_weights_after_loading finishes them for
the target device (base_loader.py's order).
"""

from __future__ import annotations

import contextlib
import os

import torch
from torch import nn

from libvllm.engine.errors import ModelLoadError
from libvllm.engine.layers.linear import dense_weights_on, materialize_meta_weights
from libvllm.engine.layers.quantization import (
    QuantizationConfig,
    apply_quant_config,
    get_quant_config,
    process_weights_after_loading,
)
from libvllm.engine.model_loader.fp8_weights import fp8_weights_iterator
from libvllm.engine.model_loader.hf_config import (
    arch_config_from_hf,
    read_generation_config,
    read_json_object,
)
from libvllm.engine.model_loader.weight_utils import (
    checkpoint_numel,
    safetensors_files,
)
from libvllm.engine.models.config import ModelArchConfig
from libvllm.engine.models.registry import resolve_model_cls

MAX_ARCHITECTURES = 16


def read_hf_arch(model_dir: str, quantization: str | None = None
                 ) -> tuple[type[nn.Module], ModelArchConfig, QuantizationConfig | None]:
    """Model class, config and quantization of an HF directory (config.json +
    generation_config.json; `quantization` is EngineConfig.quantization)."""
    config = read_json_object(os.path.join(model_dir, "config.json"))
    archs = config.get("architectures")
    if not isinstance(archs, list) or not archs or len(archs) > MAX_ARCHITECTURES or \
            not all(isinstance(a, str) for a in archs):
        raise ModelLoadError(f"{model_dir}/config.json: architectures must be a non-empty "
                             "list of names")
    cls, arch = resolve_model_cls(archs)
    cfg = arch_config_from_hf(config, arch, os.path.basename(os.path.normpath(model_dir)))
    cfg.generation_config = read_generation_config(model_dir)
    text = config.get("text_config")  # a VL wrapper's text model
    layers = config.get("num_hidden_layers",
                        text.get("num_hidden_layers") if isinstance(text, dict) else None)
    cfg.checkpoint_layers = layers if isinstance(layers, int) else -1
    return cls, cfg, get_quant_config(config, quantization)


def load_hf_model(model_dir: str, build, quantization: str | None = None,
                  device: torch.device | None = None) -> tuple[nn.Module, ModelArchConfig]:
    """Model and config of an HF directory; `build(cls, cfg, numel)` makes the module;
    quantized layers are finished for `device` (dequantized unless it is CUDA)."""
    cls, cfg, qcfg = read_hf_arch(model_dir, quantization)
    files = safetensors_files(model_dir)
    fp8 = qcfg is not None and qcfg.scheme.serialized
    # an FP8 checkpoint: the dense weights its layers replace are never allocated
    with dense_weights_on("meta") if fp8 else contextlib.nullcontext():
        cfg.checkpoint_numel = checkpoint_numel(files)
        model = build(cls, cfg, cfg.checkpoint_numel)
    if qcfg is not None:
        apply_quant_config(model, qcfg, torch.device("cpu"))
    materialize_meta_weights(model, torch.device("cpu"))
    model.load_weights(fp8_weights_iterator(files, qcfg))
    process_weights_after_loading(model, device or torch.device("cpu"))
    return model, cfg
