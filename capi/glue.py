"""capi.glue: the Python side of libvllm.so, one function per glue_* of capi/glue.h.

This module holds the engine, tokenizer and chat template functions; capi.caller_driven
(vllm_request_add / vllm_engine_step), capi.streams (background loop, pull/push
streaming), capi.openai_glue (the OpenAI layer) and capi.logs (log routing) hold the
rest, and capi.plumbing what they share (exception -> status mapping, handle
registries). Importing this module registers all of them. The C shims have already
checked NULL pointers and struct sizes. No engine logic lives here: each function
converts C values, calls the engine session (engine/session/), and converts back.
"""

from __future__ import annotations

import json
import sys
import warnings

from _libvllm import ffi, lib

from libvllm.capi import (  # noqa: F401  (glue_* bodies)
    at_exit,
    caller_driven,
    engine_state,
    logs,
    model_meta,
    openai_glue,
    pooling_glue,
    streams,
)
from libvllm.capi.plumbing import (
    BufferTooSmallError,
    EngineHandle,
    c_string,
    copy_out,
    engines,
    export,
    f32,
    optional_text,
    text,
)
from libvllm.capi.release import release_memory
from libvllm.engine.session import EngineConfig, EngineSession, InvalidArgumentError


def _quiet_embedded_interpreter() -> None:
    """In a C host: flush stdout per line (no exit hook flushes it) and keep Python's
    warnings off the host's terminal (PYTHONWARNINGS / -W still apply)."""
    if not lib.glue_owns_interpreter():
        return
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)
    if not sys.warnoptions:
        warnings.simplefilter("ignore")


# --------------------------------------------------------------------------- lifecycle


@export
def glue_init() -> None:
    """Nothing left to do: importing this module imported the engine."""


@export
def glue_shutdown() -> None:
    errors = []
    for key in list(engines):
        try:
            _free(key)
        except Exception as e:
            errors.append(e)
    streams.forget_all()
    openai_glue.forget_all()
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    if errors:
        raise errors[0]


# --------------------------------------------------------------------------- engine


# vllm_engine_params fields by how C says "unset": NULL (or "" where vllm.h documents
# NULL or "" as the default), 0 (numbers whose 0 means "the default"), 0 (tristates).
# Unset fields are left out, so EngineConfig's defaults apply; the rest are always set.
_TEXT = ("served_model_name", "tokenizer", "tool_strict_level")
_TEXT_OR_EMPTY = ("device", "dtype", "structured_outputs_backend", "reasoning_parser",
                  "tool_call_parser", "load_format", "reasoning_start_str",
                  "reasoning_end_str", "quantization", "kv_cache_dtype", "mamba_cache_dtype",
                  "mamba_ssm_cache_dtype", "mamba_cache_mode", "runner", "convert",
                  "pooler_config")
_NONZERO = ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size",
            "kv_cache_memory_bytes", "n_threads", "tensor_parallel_size")
_BOOL = ("enable_prefix_caching", "enable_chunked_prefill", "enforce_eager",
         "enable_auto_tool_choice", "skip_tokenizer_init", "calculate_kv_scales")
_TRISTATE = ("async_scheduling", "multiprocessing")


def _engine_config(model: str, p) -> EngineConfig:
    """vllm_engine_params -> EngineConfig with only the fields the caller set."""
    kwargs: dict = {"seed": p.seed}
    for name in _TEXT:
        value = optional_text(getattr(p, name), f"params->{name}")
        if value is not None:
            kwargs[name] = value
    for name in _TEXT_OR_EMPTY:
        value = optional_text(getattr(p, name), f"params->{name}")
        if value:
            kwargs[name] = value
    for name in _NONZERO:
        if getattr(p, name):
            kwargs[name] = getattr(p, name)
    for name in _BOOL:
        kwargs[name] = bool(getattr(p, name))
    for name in _TRISTATE:
        value = _tristate(getattr(p, name), f"params->{name}")
        if value is not None:
            kwargs[name] = value
    if p.gpu_memory_utilization:
        kwargs["gpu_memory_utilization"] = f32(p.gpu_memory_utilization)
    return EngineConfig(model=model, **kwargs)


def _tristate(value: int, name: str) -> bool | None:
    """1: True, -1: False, 0: None (the engine decides)."""
    if value not in (-1, 0, 1):
        raise InvalidArgumentError(f"{name} must be -1, 0 or 1, got {value}")
    return None if value == 0 else value == 1


def _report_progress(p, fraction: float) -> bool:
    """Calls the caller's progress callback; False when it asked to abort the load."""
    if p.progress_callback == ffi.NULL:
        return True
    return lib.glue_emit_progress(p.progress_callback, fraction,
                                  p.progress_callback_user_data) != 0


@export
def glue_engine_create(model_path, params, out) -> None:
    config = _engine_config(text(model_path, "model_path"), params)
    watched = params.progress_callback != ffi.NULL  # unwatched: no per-tensor round trip
    session = EngineSession.create(
        config, chat_template=optional_text(params.chat_template, "params->chat_template"),
        progress=(lambda fraction: _report_progress(params, fraction)) if watched else None)
    out[0] = engines.add(EngineHandle(session))
    at_exit.install(glue_shutdown)  # torch is loaded now: its exit destructors run after


def _free(key: int) -> None:
    handle = engines.take(key)
    handle.session.shutdown()
    del handle
    release_memory()


@export
def glue_engine_free(key) -> None:
    _free(key)


def _cstr(value: str | None):
    return ffi.NULL if value is None else ffi.new("char[]", value.encode("utf-8"))


@export
def glue_engine_model_info(key, out) -> None:
    handle = engines.get_live(key)
    info = handle.session.model_info()
    if handle.info is None:  # alive with the handle: out points into it
        eog = list(info.eog_token_ids)
        handle.info = {name: _cstr(getattr(info, name)) for name in (
            "architecture", "name", "device", "dtype", "chat_template", "quantization",
            "kv_cache_dtype")}
        handle.info["eog_token_ids"] = ffi.new("int32_t[]", eog) if eog else ffi.NULL
    for name in ("vocab_size", "max_model_len", "bos_token_id", "eos_token_id", "n_params",
                 "n_layers", "kv_capacity_tokens"):
        setattr(out, name, getattr(info, name))
    for name, value in handle.info.items():
        setattr(out, name, value)
    out.n_eog_token_ids = len(info.eog_token_ids)


@export
def glue_engine_metrics(key, out) -> None:
    stats = engines.get_live(key).session.metrics()
    success = stats.pop("request_success")
    for name, value in stats.items():
        setattr(out, name, value)
    for reason in ("stop", "length", "abort", "error", "repetition"):
        setattr(out, f"request_success_{reason}", success[reason])


# --------------------------------------------------------------------------- tokenizer


@export
def glue_tokenize(key, text_ptr, text_len, add_special, parse_special, tokens, capacity,
                  n_tokens) -> None:
    session = engines.get_live(key).session
    session.tokenizer()  # no tokenizer: that error before the text's
    data = ffi.unpack(text_ptr, text_len) if text_len else b""
    try:
        value = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidArgumentError(f"text is not valid UTF-8: {e}") from None
    ids = session.tokenize(value, add_special=bool(add_special),
                           parse_special=bool(parse_special))
    n_tokens[0] = len(ids)
    if len(ids) > capacity:
        raise BufferTooSmallError(f"{len(ids)} tokens do not fit in capacity {capacity}")
    tokens[0 : len(ids)] = ids


@export
def glue_detokenize(key, tokens, n_tokens, skip_special_tokens, buf, capacity, n_bytes) -> None:
    session = engines.get_live(key).session
    ids = list(tokens[0:n_tokens]) if n_tokens else []
    decoded = session.detokenize(ids, skip_special_tokens=bool(skip_special_tokens))
    copy_out(decoded.encode("utf-8", "replace"), buf, capacity, n_bytes)


@export
def glue_token_to_piece(key, token, special, buf, capacity, n_bytes) -> None:
    piece = engines.get_live(key).session.token_to_piece(token, special=bool(special))
    copy_out(piece, buf, capacity, n_bytes)


# --------------------------------------------------------------------------- chat template


def _json_list(value: str, what: str) -> list[dict]:
    try:
        items = json.loads(value)
    except (json.JSONDecodeError, RecursionError) as e:  # RecursionError: absurd nesting
        raise InvalidArgumentError(f"{what} is not valid JSON: {e}") from None
    if not isinstance(items, list) or not all(isinstance(m, dict) for m in items):
        raise InvalidArgumentError(f"{what} must be a JSON array of objects")
    return items


def _render(key, messages_json, tools_json, add_generation_prompt, out) -> None:
    session = engines.get_live(key).session
    messages = _json_list(text(messages_json, "messages_json"), "messages_json")
    tools = optional_text(tools_json, "tools_json")
    prompt = session.render_chat_template(
        messages, add_generation_prompt=bool(add_generation_prompt),
        tools=None if tools is None else _json_list(tools, "tools_json"))
    out[0] = c_string(prompt)


@export
def glue_chat_template_apply(key, messages_json, add_generation_prompt, out) -> None:
    _render(key, messages_json, ffi.NULL, add_generation_prompt, out)


@export
def glue_chat_template_render(key, messages_json, tools_json, add_generation_prompt, out):
    _render(key, messages_json, tools_json, add_generation_prompt, out)


_quiet_embedded_interpreter()
