"""The model description an engine session reports: vllm_model_info's fields and the
model's metadata key/values (include/vllm.h vllm_model_meta_*, as llama.h's
llama_model_meta_*).

What the core resolved comes from its ready message (EngineCoreReady, vLLM's handshake):
KV capacity = num_gpu_blocks * block_size (vLLM's num_gpu_blocks), device and dtype (a
"cuda" or available CUDA device; dtype the configured one, else bfloat16 on CUDA, float32
on CPU), end-of-generation ids. The key/values are the GGUF file's (engine/gguf/reader.py;
tensor infos give the parameter count) or a Hugging Face directory's config.json and
safetensors headers (JSON only, no tensor data), read once per session on first use.
quantization / kv_cache_dtype: engine/session/weight_format.py.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass

from engine.config import EngineConfig
from engine.gguf.reader import GGUFReader
from engine.llm_engine import LLMEngine
from engine.model_source import resolve_model_path
from engine.session.weight_format import kv_cache_dtype, quantization


@dataclass(frozen=True)
class SessionModelInfo:
    """vllm_model_info's values."""

    vocab_size: int
    max_model_len: int
    bos_token_id: int  # -1: none
    eos_token_id: int  # -1: none
    architecture: str
    name: str
    n_params: int  # -1: unknown
    n_layers: int  # -1: unknown
    kv_capacity_tokens: int
    device: str
    dtype: str
    chat_template: str | None
    eog_token_ids: tuple[int, ...]
    quantization: str | None  # None: unquantized
    kv_cache_dtype: str


def _gguf(path: str) -> tuple[dict, int, int]:
    with GGUFReader(path) as r:
        kv = dict(r.metadata)
        n_params = sum(t.n_elements for t in r.tensors.values())
    arch = kv.get("general.architecture")
    layers = kv.get(f"{arch}.block_count", -1)
    return kv, n_params, layers if isinstance(layers, int) else -1


def _safetensors_params(path: str) -> int:
    """Elements of every tensor listed in the directory's safetensors headers."""
    total = 0
    for name in sorted(f for f in os.listdir(path) if f.endswith(".safetensors")):
        with open(os.path.join(path, name), "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        total += sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")
    return total


def _hf(path: str, dummy: bool) -> tuple[dict, int, int]:
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        kv = json.load(f)
    layers = kv.get("num_hidden_layers", kv.get("text_config", {}).get("num_hidden_layers"))
    return kv, -1 if dummy else _safetensors_params(path), layers if isinstance(
        layers, int) else -1


def read_metadata(config: EngineConfig) -> tuple[dict, int, int, bool]:
    """(key/values, parameter count, layer count, is GGUF) of config's model."""
    if config.load_format == "dummy":
        return (*_hf(config.model, dummy=True), False)
    kind, path = resolve_model_path(config.model)
    return (*(_gguf(path) if kind == "gguf" else _hf(path, False)), kind == "gguf")


def describe(engine: LLMEngine, config: EngineConfig, kv: dict, n_params: int, n_layers: int,
             is_gguf: bool) -> SessionModelInfo:
    info, ready = engine.model_info, engine.engine_core.ready
    template = None if engine.tokenizer is None else engine.tokenizer.chat_template
    eog = sorted({info.eos_token_id, *ready.eos_token_ids} - {-1})
    return SessionModelInfo(
        vocab_size=info.vocab_size, max_model_len=info.max_model_len,
        bos_token_id=info.bos_token_id, eos_token_id=info.eos_token_id,
        architecture=info.architecture, name=info.name, n_params=n_params, n_layers=n_layers,
        kv_capacity_tokens=ready.num_gpu_blocks * ready.config.cache.block_size,
        device=ready.device, dtype=ready.dtype, chat_template=template, eog_token_ids=tuple(eog),
        quantization=quantization(config.quantization, kv, is_gguf),
        kv_cache_dtype=kv_cache_dtype(config.kv_cache_dtype, ready.dtype))
