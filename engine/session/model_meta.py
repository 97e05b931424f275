"""The model description an engine session reports: vllm_model_info's fields and the
model's metadata key/values (include/vllm.h vllm_model_meta_*, as llama.h's
llama_model_meta_*).

What the core resolved comes from its ready message (EngineCoreReady, vLLM's handshake):
KV capacity = num_gpu_blocks * block_size (vLLM's num_gpu_blocks), device and dtype (a
"cuda" or available CUDA device; dtype the configured one, else bfloat16 on CUDA, float32
on CPU), end-of-generation ids, and what the loader found in the checkpoint: the parameter
count (elements of the GGUF's or the safetensors' tensors, from the tensor index it read),
the layer count and a GGUF's key/values. The model file is never re-opened here; a Hugging
Face directory's config.json (small) is read once per session on first use.
quantization / kv_cache_dtype: engine/session/weight_format.py.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from libvllm.engine.config import EngineConfig
from libvllm.engine.llm_engine import LLMEngine
from libvllm.engine.session.weight_format import kv_cache_dtype, quantization


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


def read_metadata(engine: LLMEngine, config: EngineConfig) -> tuple[dict, int, int, bool]:
    """(key/values, parameter count, layer count, is GGUF) of config's model: the counts
    the loader made and a GGUF's key/values from the core's ready message, a Hugging Face
    directory's config.json read here (small; the session keeps it)."""
    ready = engine.engine_core.ready
    kv = ready.gguf_metadata
    if kv is None:
        with open(os.path.join(config.model, "config.json"), encoding="utf-8") as f:
            kv = json.load(f)
    return kv, ready.n_params, ready.n_layers, ready.gguf_metadata is not None


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
