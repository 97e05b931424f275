"""capi.model_meta: vllm_model_meta_count / _key / _value (since ABI 1.0, as llama.h's
llama_model_meta_*): the engine session's model metadata (engine/session/model_meta.py)
as C strings.
"""

from __future__ import annotations

import json

from libvllm.capi.plumbing import copy_out, engines, export, text
from libvllm.engine.session import InvalidArgumentError, NotFoundError


def value_text(value: object) -> str:
    """A metadata value as vllm_model_meta_value gives it."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(value, ensure_ascii=False)


def _metadata(key) -> dict:
    return engines.get_live(key).session.model_metadata()


@export
def glue_model_meta_count(key, n) -> None:
    n[0] = len(_metadata(key))


@export
def glue_model_meta_key(key, index, buf, capacity, n_bytes) -> None:
    keys = list(_metadata(key))
    if index >= len(keys):
        raise InvalidArgumentError(f"index {index} is out of range: the model has {len(keys)} "
                                   "metadata keys")
    copy_out(keys[index].encode("utf-8"), buf, capacity, n_bytes)


@export
def glue_model_meta_value(key, name, buf, capacity, n_bytes) -> None:
    kv = _metadata(key)
    name = text(name, "key")
    if name not in kv:
        raise NotFoundError(f"the model has no metadata key {name!r}")
    copy_out(value_text(kv[name]).encode("utf-8", "replace"), buf, capacity, n_bytes)
