"""load_format="dummy": a model with its architecture's shapes and random weights.

Mirrors vllm/model_executor/model_loader/dummy_loader.py (DummyModelLoader) and
weight_utils.py's initialize_dummy_weights: only config.json (and generation_config.json
when present) is read; the model is built directly on the target device in the target
dtype (no fp32 copy on the host), and every floating-point tensor of its state dict is
filled with uniform values in [low, high), each from a generator seeded with `seed`
(vLLM: -1e-3, 1e-3, 1234). No weight file is opened, so benchmarks can run real
architectures' shapes (Llama-3.1-8B, Qwen3-30B-A3B) from a config directory alone.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from engine.errors import ModelLoadError
from engine.model_loader.safetensors_loader import read_hf_arch
from engine.models.config import ModelArchConfig

DUMMY_LOW, DUMMY_HIGH, DUMMY_SEED = -1e-3, 1e-3, 1234


def initialize_dummy_weights(model: nn.Module, low: float = DUMMY_LOW,
                             high: float = DUMMY_HIGH, seed: int = DUMMY_SEED) -> None:
    """Fill every floating-point state-dict tensor with U[low, high), seeded per tensor."""
    with torch.no_grad():
        for param in model.state_dict().values():
            if torch.is_floating_point(param):
                gen = torch.Generator(device=param.device)
                gen.manual_seed(seed)
                param.uniform_(low, high, generator=gen)


def load_dummy_model(model_dir: str, device: torch.device, dtype: torch.dtype
                     ) -> tuple[nn.Module, ModelArchConfig]:
    """(model in eval mode on `device` in `dtype`, its config) from `model_dir`/config.json."""
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        raise ModelLoadError(f"{model_dir}: load_format 'dummy' needs a directory with "
                             "config.json")
    cls, cfg = read_hf_arch(model_dir)
    old_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = cls(cfg)
    finally:
        torch.set_default_dtype(old_dtype)
    initialize_dummy_weights(model)
    return model.eval(), cfg
