"""Model and tokenizer loading for the engine core and the front end.

The core loads the weights and its own tokenizer (grammar compilation, the eos id); a
front end whose core runs in a child process loads the tokenizer alone, from the same
source, without reading any weight (vLLM's front end does the same from the model
directory: vllm/v1/engine/llm_engine.py builds its tokenizer, the core its model).
"""

from __future__ import annotations

import torch

from engine.config import EngineConfig
from engine.errors import InvalidArgumentError
from engine.gguf.reader import GGUFReader
from engine.model_loader import load_model, resolve_model_path
from engine.models.config import ModelArchConfig
from engine.tokenizer import Tokenizer

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
    model, arch, source = load_model(config.model, config.load_format, device, dtype)
    try:
        tokenizer = load_tokenizer(config, source)
    finally:
        if not isinstance(source, str):
            source.close()
    return model.to(device=device, dtype=dtype), arch, tokenizer, device, dtype


def load_tokenizer(config: EngineConfig, source: GGUFReader | str | None = None
                   ) -> Tokenizer | None:
    """The engine's tokenizer (None with skip_tokenizer_init). source: the open GGUF
    reader or HF directory the model came from; None: found from config.model."""
    if config.skip_tokenizer_init:  # vLLM: token-id prompts, token-id outputs
        return None
    if config.tokenizer is not None:  # vLLM --tokenizer
        return Tokenizer.from_hf_dir(config.tokenizer)
    if source is None:
        if config.load_format == "dummy":
            return Tokenizer.from_hf_dir(config.model)
        kind, path = resolve_model_path(config.model)
        if kind == "hf":
            return Tokenizer.from_hf_dir(path)
        reader = GGUFReader(path)
        try:
            return Tokenizer.from_gguf_metadata(reader.metadata)
        finally:
            reader.close()
    if isinstance(source, str):  # a Hugging Face directory
        return Tokenizer.from_hf_dir(source)
    return Tokenizer.from_gguf_metadata(source.metadata)
