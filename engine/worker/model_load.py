"""Model and tokenizer loading for the engine core: its device and dtype, the weights,
and its own tokenizer (grammar compilation, the eos id) from the same source. A front end
whose core runs in a child process loads the tokenizer alone (engine/model_source.py).
"""

from __future__ import annotations

import torch

from libvllm.engine.config import EngineConfig
from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.model_loader import load_model
from libvllm.engine.model_source import load_tokenizer
from libvllm.engine.models.config import ModelArchConfig
from libvllm.engine.tokenizer import Tokenizer

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(config: EngineConfig) -> torch.device:
    device = torch.device("cuda" if config.device == "cuda" or (
        config.device == "auto" and torch.cuda.is_available()) else "cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InvalidArgumentError("device 'cuda' requested but CUDA is not available")
    return device


def load_model_and_tokenizer(config: EngineConfig) -> tuple[
        torch.nn.Module, ModelArchConfig, Tokenizer | None, torch.device, torch.dtype]:
    device = resolve_device(config)
    dtype = _DTYPES.get(config.dtype) or (
        torch.bfloat16 if device.type == "cuda" else torch.float32)
    torch.manual_seed(config.seed)
    model, arch, source = load_model(config.model, config.load_format, device, dtype,
                                       config.quantization)
    try:
        tokenizer = load_tokenizer(config, source)
    finally:
        if not isinstance(source, str):
            source.close()
    return model.to(device=device, dtype=dtype), arch, tokenizer, device, dtype
