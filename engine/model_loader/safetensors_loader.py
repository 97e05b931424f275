"""Hugging Face directory (config.json + safetensors) -> model, as
vllm/model_executor/model_loader/default_loader.py (DefaultModelLoader).

architectures in config.json select the model class through the registry (never code from
the directory: auto_map is ignored); generation_config.json is read into
ModelArchConfig.generation_config for the engine's default sampling parameters.
"""

from __future__ import annotations

import os

from torch import nn

from engine.errors import ModelLoadError
from engine.model_loader.hf_config import (
    arch_config_from_hf,
    read_generation_config,
    read_json_object,
)
from engine.model_loader.weight_utils import (
    checkpoint_numel,
    safetensors_files,
    safetensors_weights_iterator,
)
from engine.models.config import ModelArchConfig
from engine.models.registry import resolve_model_cls

MAX_ARCHITECTURES = 16


def read_hf_arch(model_dir: str) -> tuple[type[nn.Module], ModelArchConfig]:
    """Model class and config of an HF directory (config.json + generation_config.json)."""
    config = read_json_object(os.path.join(model_dir, "config.json"))
    archs = config.get("architectures")
    if not isinstance(archs, list) or not archs or len(archs) > MAX_ARCHITECTURES or \
            not all(isinstance(a, str) for a in archs):
        raise ModelLoadError(f"{model_dir}/config.json: architectures must be a non-empty "
                             "list of names")
    cls, arch = resolve_model_cls(archs)
    cfg = arch_config_from_hf(config, arch, os.path.basename(os.path.normpath(model_dir)))
    cfg.generation_config = read_generation_config(model_dir)
    return cls, cfg


def load_hf_model(model_dir: str, build) -> tuple[nn.Module, ModelArchConfig]:
    """Model and config of an HF directory; `build(cls, cfg, numel)` makes the module."""
    cls, cfg = read_hf_arch(model_dir)
    files = safetensors_files(model_dir)
    model = build(cls, cfg, checkpoint_numel(files))
    model.load_weights(safetensors_weights_iterator(files))
    return model, cfg
