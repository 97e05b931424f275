"""Model loading: resolve a path, read a GGUF file or a Hugging Face directory, build the
model and load its weights.

Mirrors vllm/model_executor/model_loader/__init__.py (get_model_loader / load_model): a
path is a .gguf file (or a directory holding exactly one), else a directory with
config.json and safetensors files (engine/model_source.py resolve_model_path). Before
any parameter memory is allocated, the model is built on the meta device and its
parameter count checked against the elements the checkpoint actually holds, so a hostile
config cannot ask for a giant allocation.
load_format "dummy" (vLLM's DummyModelLoader, engine/model_loader/dummy_loader.py) reads
config.json only and fills random weights on the target device. On CUDA, a GGUF file's
quantized linear weights stay quantized (engine/model_loader/gguf_quant.py), under tensor
parallelism as this rank's blocks (engine/model_loader/gguf_shard.py).
`quantization` is EngineConfig.quantization (vLLM's --quantization): checked against the
checkpoint's quantization_config (engine/layers/quantization/); a GGUF file is its own
method ("gguf"), so any value there is vLLM's mismatch error.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from libvllm.engine.errors import InvalidArgumentError, ModelLoadError
from libvllm.engine.gguf.reader import GGUFReader
from libvllm.engine.load_progress import track
from libvllm.engine.model_loader import gguf_hybrid, gguf_loader
from libvllm.engine.model_loader.dummy_loader import load_dummy_model
from libvllm.engine.model_loader.gguf_quant import keep_gguf_quantized
from libvllm.engine.model_loader.safetensors_loader import load_hf_model
from libvllm.engine.model_source import resolve_model_path
from libvllm.engine.models.config import ModelArchConfig
from libvllm.engine.models.registry import resolve_model_cls


def build_model(cls: type[nn.Module], cfg: ModelArchConfig, checkpoint_numel: int
                ) -> nn.Module:
    """`cls(cfg)` once its parameters are known to fit in what the checkpoint holds."""
    with torch.device("meta"):
        need = sum(p.numel() for p in cls(cfg).parameters())
    if need > 2 * checkpoint_numel + (1 << 20):
        raise ModelLoadError(f"the config describes {need} parameters but the checkpoint "
                             f"holds {checkpoint_numel} values")
    return cls(cfg)


def load_model(path: str, load_format: str = "auto", device: torch.device | None = None,
               dtype: torch.dtype = torch.float32, quantization: str | None = None
               ) -> tuple[nn.Module, ModelArchConfig, GGUFReader | str]:
    """(model in eval mode, its config, tokenizer source).

    The tokenizer source is the open GGUFReader (its metadata holds the vocabulary; the
    caller closes it) or, for a Hugging Face directory, the directory path. With
    load_format "dummy" the model is built on `device` in `dtype` with random weights;
    otherwise on the host in fp32 (the caller moves it).
    """
    if load_format == "dummy":
        if not os.path.isdir(path):
            raise ModelLoadError(f"load_format 'dummy' needs a model directory, got {path}")
        model, cfg = load_dummy_model(path, device or torch.device("cpu"), dtype,
                                      quantization)
        return model, cfg, path
    kind, resolved = resolve_model_path(path)
    if kind == "hf":
        model, cfg = load_hf_model(resolved, build_model, quantization, device)
        return model.eval(), cfg, resolved
    if quantization is not None:
        raise InvalidArgumentError(
            "Quantization method specified in the model config (gguf) does not match the "
            f"quantization method specified in the `quantization` argument ({quantization}).")
    return load_gguf_model(resolved, keep_quantized=device is not None and device.type == "cuda")


def load_gguf_model(path: str, keep_quantized: bool = False
                    ) -> tuple[nn.Module, ModelArchConfig, GGUFReader]:
    """(model, config, open reader) of a GGUF file. keep_quantized (the CUDA path): linear
    weights with a GGUF kernel keep their raw blocks (gguf_quant.py) and are never
    dequantized; their dense parameters are dropped before the load."""
    reader = GGUFReader(path)
    try:
        cfg = gguf_loader.arch_config_from_gguf(reader)
        cfg.generation_config = gguf_loader.generation_config(reader.metadata, cfg.vocab_size)
        cls, _ = resolve_model_cls(list(cfg.architectures))
        cfg.checkpoint_numel = gguf_loader.checkpoint_numel(reader)
        cfg.checkpoint_layers = gguf_loader.checkpoint_layers(reader.metadata)
        cfg.checkpoint_metadata = reader.metadata
        model = build_model(cls, cfg, cfg.checkpoint_numel)
        keep_quantized &= cfg.architecture not in gguf_hybrid.HYBRID_GGUF_ARCHITECTURES
        absorbed = keep_gguf_quantized(model, reader, cfg) if keep_quantized else set()
        weights = gguf_loader.gguf_weights_iterator(reader, cfg, skip=absorbed)
        model.load_weights(track(weights, len(reader.tensors) - len(absorbed)))
    except BaseException:
        reader.close()
        raise
    return model.eval(), cfg, reader
