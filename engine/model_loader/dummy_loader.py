"""load_format="dummy": a model with its architecture's shapes and random weights.

Mirrors vllm/model_executor/model_loader/dummy_loader.py (DummyModelLoader) and
weight_utils.py's initialize_dummy_weights: only config.json (and generation_config.json
when present) is read; the model is built directly on the target device in the target
dtype (no fp32 copy on the host), and every floating-point tensor of its state dict is
filled with uniform values in [low, high), each from a generator seeded with `seed`
(vLLM: -1e-3, 1e-3, 1234). No weight file is opened, so benchmarks can run real
architectures' shapes (Llama-3.1-8B, Qwen3-30B-A3B) from a config directory alone.
With a quantization_config in config.json (or `quantization`), the layers take the real
FP8 layout (engine/layers/quantization/): fp8 weights U[-1, 1) and positive scales
U[1e-3, 2e-3) (so dequantized weights are about the dense dummy's size), then
process_weights_after_loading as for a real checkpoint. The layers' dense weights are then
built on the meta device (never allocated) and only what stays dense is materialized.
"""

from __future__ import annotations

import contextlib
import os

import torch
from torch import nn

from libvllm.engine.errors import ModelLoadError
from libvllm.engine.layers.linear import dense_weights_on, materialize_meta_weights
from libvllm.engine.layers.quantization import apply_quant_config, process_weights_after_loading
from libvllm.engine.model_loader.safetensors_loader import read_hf_arch
from libvllm.engine.models.config import ModelArchConfig

DUMMY_LOW, DUMMY_HIGH, DUMMY_SEED = -1e-3, 1e-3, 1234


def initialize_dummy_weights(model: nn.Module, low: float = DUMMY_LOW,
                             high: float = DUMMY_HIGH, seed: int = DUMMY_SEED) -> None:
    """Fill every floating-point state-dict tensor with U[low, high), seeded per tensor."""
    with torch.no_grad():
        for name, param in model.state_dict().items():
            if torch.is_floating_point(param):
                gen = torch.Generator(device=param.device)
                gen.manual_seed(seed)
                if param.dtype == torch.float8_e4m3fn:
                    param.copy_(torch.empty(param.shape, device=param.device).uniform_(
                        -1.0, 1.0, generator=gen))
                elif name.endswith(("_scale", "_scale_inv")):
                    param.uniform_(1e-3, 2e-3, generator=gen)
                else:
                    param.uniform_(low, high, generator=gen)


def load_dummy_model(model_dir: str, device: torch.device, dtype: torch.dtype,
                     quantization: str | None = None) -> tuple[nn.Module, ModelArchConfig]:
    """(model in eval mode on `device` in `dtype`, its config) from `model_dir`/config.json."""
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        raise ModelLoadError(f"{model_dir}: load_format 'dummy' needs a directory with "
                             "config.json")
    cls, cfg, qcfg = read_hf_arch(model_dir, quantization)
    old_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        # quantized: the dense weights are never allocated (peak memory = the FP8 model)
        with torch.device(device), dense_weights_on("meta") if qcfg is not None \
                else contextlib.nullcontext():
            model = cls(cfg)
            if qcfg is not None:
                apply_quant_config(model, qcfg, device)
        materialize_meta_weights(model, device)
    finally:
        torch.set_default_dtype(old_dtype)
    initialize_dummy_weights(model)
    if qcfg is not None:
        process_weights_after_loading(model, device)
        model.to(dtype=dtype)  # the CPU path's dequantized weights are fp32
    return model.eval(), cfg
