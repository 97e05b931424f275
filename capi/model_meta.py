"""capi.model_meta: the model metadata of include/vllm.h (since ABI 1.0):
vllm_model_meta_count / _key / _value (as llama.h's llama_model_meta_*) and the 1.0
fields of vllm_model_info (n_params, n_layers, kv_capacity_tokens, device, dtype,
chat_template, eog_token_ids) and the 1.3 ones (quantization, kv_cache_dtype: see
capi.weight_format).

Read by the front end, once per engine: the key/values of the GGUF file
(engine/gguf/reader.py; tensor infos give the parameter count) or the config.json and
safetensors headers (JSON only, no tensor data) of a Hugging Face directory. The KV
capacity is the core's block count (EngineCoreReady.num_gpu_blocks, as vLLM's
num_gpu_blocks) times block_size. Device and dtype are what the core resolved
(EngineCoreReady.device / dtype): a "cuda" or available CUDA device, dtype the
configured one else bfloat16 on CUDA, float32 on CPU.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass

from _libvllm import ffi

from capi import weight_format
from capi.plumbing import copy_out, engines, export, text
from engine.errors import InvalidArgumentError, NotFoundError
from engine.gguf.reader import GGUFReader
from engine.model_source import resolve_model_path


@dataclass
class ModelMeta:
    kv: dict[str, object]
    keys: list[str]
    n_params: int  # -1: unknown
    n_layers: int  # -1: unknown
    cdata: dict  # what vllm_model_info points into, alive with the engine record


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


def _meta(record) -> ModelMeta:
    if record.meta is None:
        config, engine = record.config, record.engine
        kind = "hf"
        if config.load_format == "dummy":
            kv, n_params, n_layers = _hf(config.model, dummy=True)
        else:
            kind, path = resolve_model_path(config.model)
            kv, n_params, n_layers = _gguf(path) if kind == "gguf" else _hf(path, False)
        quant = weight_format.quantization(config.quantization, kv, kind == "gguf")
        device, dtype = engine.engine_core.ready.device, engine.engine_core.ready.dtype
        template = None if engine.tokenizer is None else engine.tokenizer.chat_template
        eog = sorted({engine.model_info.eos_token_id, *engine.engine_core.ready.eos_token_ids}
                     - {-1})
        cdata = {"device": ffi.new("char[]", device.encode()),
                 "dtype": ffi.new("char[]", dtype.encode()),
                 "chat_template": ffi.NULL if template is None else ffi.new(
                     "char[]", template.encode("utf-8")),
                 "eog": ffi.new("int32_t[]", eog) if eog else ffi.NULL, "n_eog": len(eog),
                 "quantization": ffi.NULL if quant is None else ffi.new(
                     "char[]", quant.encode()),
                 "kv_cache_dtype": ffi.new("char[]", weight_format.kv_cache_dtype(
                     config.kv_cache_dtype, dtype).encode())}
        record.meta = ModelMeta(kv, list(kv), n_params, n_layers, cdata)
    return record.meta


def fill_info(record, out) -> None:
    """The 1.0 fields of vllm_model_info."""
    meta = _meta(record)
    out.n_params, out.n_layers = meta.n_params, meta.n_layers
    ready = record.engine.engine_core.ready
    out.kv_capacity_tokens = ready.num_gpu_blocks * ready.config.cache.block_size
    c = meta.cdata
    out.device, out.dtype, out.chat_template = c["device"], c["dtype"], c["chat_template"]
    out.eog_token_ids, out.n_eog_token_ids = c["eog"], c["n_eog"]
    out.quantization, out.kv_cache_dtype = c["quantization"], c["kv_cache_dtype"]  # 1.3


def value_text(value: object) -> str:
    """A metadata value as vllm_model_meta_value gives it."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(value, ensure_ascii=False)


@export
def glue_model_meta_count(key, n) -> None:
    n[0] = len(_meta(engines.get_live(key)).keys)


@export
def glue_model_meta_key(key, index, buf, capacity, n_bytes) -> None:
    keys = _meta(engines.get_live(key)).keys
    if index >= len(keys):
        raise InvalidArgumentError(f"index {index} is out of range: the model has {len(keys)} "
                                   "metadata keys")
    copy_out(keys[index].encode("utf-8"), buf, capacity, n_bytes)


@export
def glue_model_meta_value(key, name, buf, capacity, n_bytes) -> None:
    kv = _meta(engines.get_live(key)).kv
    name = text(name, "key")
    if name not in kv:
        raise NotFoundError(f"the model has no metadata key {name!r}")
    copy_out(value_text(kv[name]).encode("utf-8", "replace"), buf, capacity, n_bytes)
