"""capi.glue: the Python side of libvllm.so, one function per glue_* of capi/glue.h.

This module holds the engine, tokenizer and chat template functions; capi.caller_driven
(vllm_request_add / vllm_engine_step), capi.streams (background loop, pull/push
streaming), capi.openai_glue (the OpenAI layer) and capi.logs (log routing) hold the
rest, and capi.plumbing what they share (exception -> status mapping, handle
registries). Importing this module registers all of them. The C shims have already
checked NULL pointers and struct sizes. No engine logic lives here.
"""

from __future__ import annotations

import json
import sys
import warnings

from _libvllm import ffi, lib

from capi import (  # noqa: F401  (glue_* bodies)
    at_exit,
    caller_driven,
    engine_state,
    logs,
    model_meta,
    openai_glue,
    plain_text,
    pooling_glue,
    streams,
)
from capi.create_checks import check_create_inputs
from capi.plumbing import (
    BufferTooSmallError,
    CancelledError,
    EngineRecord,
    InvalidStateError,
    RuntimeInitError,
    c_string,
    copy_out,
    engines,
    export,
    f32,
    optional_text,
    text,
)
from capi.release import release_memory
from engine import load_progress
from engine.config import EngineConfig
from engine.errors import InvalidArgumentError


def _engine_class():
    try:
        from engine.llm_engine import LLMEngine
    except Exception as e:
        raise RuntimeInitError(f"cannot import the engine: {type(e).__name__}: {e}") from None
    return LLMEngine


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
    _engine_class()


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


def _engine_config(model: str, p) -> EngineConfig:
    return EngineConfig(
        model=model,
        device=optional_text(p.device, "params->device") or "auto",
        dtype=optional_text(p.dtype, "params->dtype") or "auto",
        max_model_len=p.max_model_len,
        max_num_seqs=p.max_num_seqs or EngineConfig.max_num_seqs,  # vllm.h: 0 = default
        max_num_batched_tokens=p.max_num_batched_tokens,
        block_size=p.block_size or EngineConfig.block_size,
        kv_cache_memory_bytes=p.kv_cache_memory_bytes,
        enable_prefix_caching=bool(p.enable_prefix_caching),
        enable_chunked_prefill=bool(p.enable_chunked_prefill),
        seed=p.seed,
        enforce_eager=bool(p.enforce_eager),
        served_model_name=optional_text(p.served_model_name, "params->served_model_name"),
        tokenizer=optional_text(p.tokenizer, "params->tokenizer"),
        structured_outputs_backend=optional_text(
            p.structured_outputs_backend, "params->structured_outputs_backend") or "auto",
        reasoning_parser=optional_text(p.reasoning_parser, "params->reasoning_parser") or "",
        tool_call_parser=optional_text(p.tool_call_parser, "params->tool_call_parser") or "",
        enable_auto_tool_choice=bool(p.enable_auto_tool_choice),
        load_format=optional_text(p.load_format, "params->load_format") or "auto",
        gpu_memory_utilization=f32(p.gpu_memory_utilization) or EngineConfig.gpu_memory_utilization,
        skip_tokenizer_init=bool(p.skip_tokenizer_init),
        async_scheduling=_tristate(p.async_scheduling, "params->async_scheduling"),
        n_threads=p.n_threads,
        multiprocessing=_tristate(p.multiprocessing, "params->multiprocessing"),
        tensor_parallel_size=p.tensor_parallel_size or 1,
        tool_strict_level=optional_text(p.tool_strict_level, "params->tool_strict_level"),
        reasoning_start_str=optional_text(
            p.reasoning_start_str, "params->reasoning_start_str") or "",
        reasoning_end_str=optional_text(p.reasoning_end_str, "params->reasoning_end_str") or "",
        # since 1.3: NULL (or "") is vLLM's default; EngineConfig checks the values
        quantization=optional_text(p.quantization, "params->quantization") or None,
        kv_cache_dtype=optional_text(p.kv_cache_dtype, "params->kv_cache_dtype") or "auto",
        calculate_kv_scales=bool(p.calculate_kv_scales),
        mamba_cache_dtype=optional_text(
            p.mamba_cache_dtype, "params->mamba_cache_dtype") or "auto",
        mamba_ssm_cache_dtype=optional_text(
            p.mamba_ssm_cache_dtype, "params->mamba_ssm_cache_dtype") or "auto",
        mamba_cache_mode=optional_text(p.mamba_cache_mode, "params->mamba_cache_mode") or None,
        runner=optional_text(p.runner, "params->runner") or "auto",
        convert=optional_text(p.convert, "params->convert") or "auto",
        pooler_config=optional_text(p.pooler_config, "params->pooler_config") or None,
    )


def _tristate(value: int, name: str) -> bool | None:
    """1: True, -1: False, 0: None (the engine decides)."""
    if value not in (-1, 0, 1):
        raise InvalidArgumentError(f"{name} must be -1, 0 or 1, got {value}")
    return None if value == 0 else value == 1


def _load_chat_template(value: str) -> str:
    """vLLM's --chat-template (renderers/chat_utils/chat_template.py): a file's text,
    else the value itself when it looks like a template."""
    try:
        with open(value, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        if not any(c in value for c in "{}\n"):
            raise InvalidArgumentError(
                f"The supplied chat template ({value}) looks like a file path, but it failed "
                f"to be opened. Tried: {value}. Reason: {e}") from None
        return value


def _report_progress(p, fraction: float) -> bool:
    """Calls the caller's progress callback; False when it asked to abort the load."""
    if p.progress_callback == ffi.NULL:
        return True
    return lib.glue_emit_progress(p.progress_callback, fraction,
                                  p.progress_callback_user_data) != 0


def _load_aborted(fraction: float) -> CancelledError:
    return CancelledError(f"vllm_engine_create: the progress callback returned 0 at "
                          f"{fraction:g}: model load aborted")


@export
def glue_engine_create(model_path, params, out) -> None:
    config = _engine_config(text(model_path, "model_path"), params)
    override = optional_text(params.chat_template, "params->chat_template")
    chat_template = None if override is None else _load_chat_template(override)
    check_create_inputs(config.model, chat_template)  # vLLM fails at start-up
    if not _report_progress(params, 0.0):
        raise _load_aborted(0.0)
    with load_progress.reporting(lambda fraction: _report_progress(params, fraction)):
        engine = _engine_class().from_config(config)
    if chat_template is not None:
        if engine.tokenizer is None:
            engine.shutdown()
            raise InvalidArgumentError("chat_template needs a tokenizer (skip_tokenizer_init)")
        engine.tokenizer.chat_template = chat_template
    if not _report_progress(params, 1.0):
        engine.shutdown()
        raise _load_aborted(1.0)
    out[0] = engines.add(EngineRecord(engine, config))
    at_exit.install(glue_shutdown)  # torch is loaded now: its exit destructors run after


def _free(key: int) -> None:
    record = engines.take(key)
    if record.loop is not None:  # aborts what is live; the loop hands out the last events
        record.loop.shutdown()
    with record.lock:  # stops the engine-core process, if any
        record.engine.shutdown()
    del record
    release_memory()


@export
def glue_engine_free(key) -> None:
    _free(key)


@export
def glue_engine_model_info(key, out) -> None:
    record = engines.get_live(key)
    info = record.engine.model_info
    if record.info_strings is None:
        record.info_strings = (
            ffi.new("char[]", info.architecture.encode("utf-8")),
            ffi.new("char[]", info.name.encode("utf-8")),
        )
    out.vocab_size = info.vocab_size
    out.max_model_len = info.max_model_len
    out.bos_token_id = info.bos_token_id
    out.eos_token_id = info.eos_token_id
    out.architecture, out.name = record.info_strings
    model_meta.fill_info(record, out)


@export
def glue_engine_metrics(key, out) -> None:
    record = engines.get_live(key)
    if record.loop is not None:  # never waits for a step: the last step's gauges
        stats = record.loop.get_stats()
    else:
        with record.lock:
            stats = record.stats.snapshot(record.engine)
    success = stats.pop("request_success")
    for name, value in stats.items():
        setattr(out, name, value)
    for reason in ("stop", "length", "abort", "error", "repetition"):
        setattr(out, f"request_success_{reason}", success[reason])


# --------------------------------------------------------------------------- tokenizer


@export
def glue_tokenize(key, text_ptr, text_len, add_special, parse_special, tokens, capacity,
                  n_tokens) -> None:
    tokenizer = _tokenizer(key)
    data = ffi.unpack(text_ptr, text_len) if text_len else b""
    try:
        value = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidArgumentError(f"text is not valid UTF-8: {e}") from None
    if parse_special:
        ids = tokenizer.encode(value, add_special_tokens=bool(add_special))
    else:
        ids = plain_text.encode(tokenizer, value, add_special=bool(add_special))
    n_tokens[0] = len(ids)
    if len(ids) > capacity:
        raise BufferTooSmallError(f"{len(ids)} tokens do not fit in capacity {capacity}")
    tokens[0 : len(ids)] = ids


@export
def glue_detokenize(key, tokens, n_tokens, skip_special_tokens, buf, capacity, n_bytes) -> None:
    tokenizer = engines.get_live(key).engine.tokenizer
    ids = list(tokens[0:n_tokens]) if n_tokens else []
    decoded = tokenizer.decode(ids, skip_special_tokens=bool(skip_special_tokens))
    copy_out(decoded.encode("utf-8", "replace"), buf, capacity, n_bytes)


def _tokenizer(key):
    tokenizer = engines.get_live(key).engine.tokenizer
    if tokenizer is None:
        raise InvalidStateError("the engine has no tokenizer (skip_tokenizer_init)")
    return tokenizer


def _token_bytes(tokenizer, token: int, special: bool) -> bytes:
    """llama_token_to_piece: the bytes the token stands for; special tokens only on request."""
    data = tokenizer.id_to_bytes(token)  # checks the range
    return b"" if token in tokenizer.all_special_ids and not special else data


@export
def glue_token_to_piece(key, token, special, buf, capacity, n_bytes) -> None:
    tokenizer = _tokenizer(key)
    copy_out(_token_bytes(tokenizer, token, bool(special)), buf, capacity, n_bytes)


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
    record = engines.get_live(key)
    messages = _json_list(text(messages_json, "messages_json"), "messages_json")
    tools = optional_text(tools_json, "tools_json")
    with record.lock:
        prompt = record.engine.apply_chat_template(
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
