"""capi.glue: the Python side of libvllm.so, one function per glue_* of capi/glue.h.

Owns the engine handle registry (small integer keys; a stale key is an error, never
a crash), the conversion of C arguments to engine calls, the memory that outputs
point to, and the mapping of exceptions to vllm.h status codes: a VllmError gives
its `.status` and message, anything else VLLM_ERR_INTERNAL. No traceback ever
reaches the host's terminal. The C shims have already checked NULL pointers and
struct sizes. No engine logic lives here.
"""

from __future__ import annotations

import functools
import itertools
import json
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from _libvllm import ffi, lib

from engine.config import EngineConfig
from engine.errors import InvalidArgumentError, OutOfResourcesError, VllmError
from engine.sampling_params import RequestOutputKind, SamplingParams

_FINISH_REASONS = {
    None: lib.VLLM_FINISH_NONE,
    "stop": lib.VLLM_FINISH_STOP,
    "length": lib.VLLM_FINISH_LENGTH,
    "abort": lib.VLLM_FINISH_ABORT,
}


class BufferTooSmallError(VllmError):
    status = lib.VLLM_ERR_BUFFER_TOO_SMALL


class InvalidHandleError(VllmError):
    status = lib.VLLM_ERR_INVALID_HANDLE


class RuntimeInitError(VllmError):
    status = lib.VLLM_ERR_RUNTIME_INIT


@dataclass
class _Engine:
    engine: Any
    # request id -> output tokens so far, for requests whose last output is not returned yet
    requests: dict[str, int] = field(default_factory=dict)
    info_strings: tuple | None = None  # cdata behind vllm_model_info's strings
    step_memory: list = field(default_factory=list)  # cdata behind the last step's outputs


_engines: dict[int, _Engine] = {}
_keys = itertools.count(1)


# --------------------------------------------------------------------------- plumbing


def _set_error(status: int, message: str) -> int:
    lib.glue_set_error(message.encode("utf-8", "replace"))
    return status


def _internal_error(exc: BaseException) -> int:
    return _set_error(lib.VLLM_ERR_INTERNAL, f"internal error: {type(exc).__name__}: {exc}")


def _uncaught(exc_type, exc, traceback) -> None:
    """cffi's last resort (when _export's own handler fails): record, never print."""
    _internal_error(exc)


def _export(fn):
    """Registers fn as the Python body of the glue_* function of the same name."""

    @functools.wraps(fn)
    def call(*args):
        try:
            fn(*args)
        except VllmError as e:
            return _set_error(e.status, str(e) or type(e).__name__)
        except BaseException as e:
            return _internal_error(e)
        return lib.VLLM_OK

    ffi.def_extern(name=fn.__name__, error=lib.VLLM_ERR_INTERNAL, onerror=_uncaught)(call)
    return call


def _text(ptr, what: str) -> str:
    try:
        return ffi.string(ptr).decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidArgumentError(f"{what} is not valid UTF-8: {e}") from None


def _stale(key: int) -> InvalidHandleError:
    return InvalidHandleError(f"invalid engine handle {key:#x} (freed or never created)")


def _record(key: int) -> _Engine:
    try:
        return _engines[key]
    except KeyError:
        raise _stale(key) from None


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


@_export
def glue_init() -> None:
    _engine_class()


@_export
def glue_shutdown() -> None:
    errors = []
    for key in list(_engines):
        try:
            _free(key)
        except Exception as e:
            errors.append(e)
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    if errors:
        raise errors[0]


# --------------------------------------------------------------------------- engine


def _optional_text(ptr, what: str) -> str | None:
    return None if ptr == ffi.NULL else _text(ptr, what)


def _engine_config(model: str, p) -> EngineConfig:
    return EngineConfig(
        model=model,
        device=_optional_text(p.device, "params->device") or "auto",
        dtype=_optional_text(p.dtype, "params->dtype") or "auto",
        max_model_len=p.max_model_len,
        max_num_seqs=p.max_num_seqs,
        max_num_batched_tokens=p.max_num_batched_tokens,
        block_size=p.block_size,
        kv_cache_memory_bytes=p.kv_cache_memory_bytes,
        enable_prefix_caching=bool(p.enable_prefix_caching),
        enable_chunked_prefill=bool(p.enable_chunked_prefill),
        seed=p.seed,
        enforce_eager=bool(p.enforce_eager),
    )


@_export
def glue_engine_create(model_path, params, out) -> None:
    config = _engine_config(_text(model_path, "model_path"), params)
    engine = _engine_class().from_config(config)
    key = next(_keys)
    _engines[key] = _Engine(engine)
    out[0] = key


def _free(key: int) -> None:
    record = _engines.pop(key, None)
    if record is None:
        raise _stale(key)
    record.engine.shutdown()


@_export
def glue_engine_free(key) -> None:
    _free(key)


@_export
def glue_engine_model_info(key, out) -> None:
    record = _record(key)
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


# --------------------------------------------------------------------------- tokenizer


@_export
def glue_tokenize(key, text, add_special_tokens, tokens, capacity, n_tokens) -> None:
    tokenizer = _record(key).engine.tokenizer
    ids = tokenizer.encode(_text(text, "text"), add_special_tokens=bool(add_special_tokens))
    n_tokens[0] = len(ids)
    if len(ids) > capacity:
        raise BufferTooSmallError(f"{len(ids)} tokens do not fit in capacity {capacity}")
    tokens[0 : len(ids)] = ids


@_export
def glue_detokenize(key, tokens, n_tokens, skip_special_tokens, buf, capacity, n_bytes) -> None:
    tokenizer = _record(key).engine.tokenizer
    ids = list(tokens[0:n_tokens]) if n_tokens else []
    text = tokenizer.decode(ids, skip_special_tokens=bool(skip_special_tokens))
    data = text.encode("utf-8", "replace")
    n_bytes[0] = len(data)
    if len(data) + 1 > capacity:
        raise BufferTooSmallError(f"{len(data)} bytes and a NUL do not fit in capacity {capacity}")
    ffi.memmove(buf, data + b"\0", len(data) + 1)


# --------------------------------------------------------------------------- chat template


def _messages(text: str) -> list[dict]:
    try:
        messages = json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidArgumentError(f"messages_json is not valid JSON: {e}") from None
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise InvalidArgumentError("messages_json must be a JSON array of message objects")
    return messages


@_export
def glue_chat_template_apply(key, messages_json, add_generation_prompt, out) -> None:
    engine = _record(key).engine
    messages = _messages(_text(messages_json, "messages_json"))
    data = engine.apply_chat_template(
        messages, add_generation_prompt=bool(add_generation_prompt)
    ).encode("utf-8")
    copy = lib.glue_strndup(data, len(data))
    if copy == ffi.NULL:
        raise OutOfResourcesError("out of memory copying the rendered chat template")
    out[0] = copy


# --------------------------------------------------------------------------- requests


def _f32(value: float) -> float:
    """A C float as the short decimal its caller wrote (0.9f -> 0.9, not 0.8999999761)."""
    return float(str(np.float32(value)))


def _sampling_params(p) -> SamplingParams:
    return SamplingParams(
        max_tokens=None if p.max_tokens < 0 else p.max_tokens,
        temperature=_f32(p.temperature),
        top_p=_f32(p.top_p),
        top_k=p.top_k,
        min_p=_f32(p.min_p),
        seed=p.seed if p.has_seed else None,
        ignore_eos=bool(p.ignore_eos),
        stop_token_ids=list(p.stop_token_ids[0 : p.n_stop_token_ids]),
        skip_special_tokens=bool(p.skip_special_tokens),
        output_kind=RequestOutputKind.DELTA,
    )


@_export
def glue_request_add(key, request_id, prompt, prompt_token_ids, n_prompt_token_ids, params):
    record = _record(key)
    rid = _text(request_id, "request_id")
    if rid in record.requests:  # includes aborted ones whose last output is still due
        raise InvalidArgumentError(f"request id {rid!r} is already in use")
    sampling = _sampling_params(params)
    if prompt != ffi.NULL:
        prompt_arg = _text(prompt, "prompt")
    else:
        prompt_arg = list(prompt_token_ids[0:n_prompt_token_ids])
    record.engine.add_request(rid, prompt_arg, sampling)
    record.requests[rid] = 0


@_export
def glue_request_abort(key, request_id) -> None:
    record = _record(key)
    record.engine.abort_request(_text(request_id, "request_id"))


def _step_outputs(record: _Engine, results) -> tuple[Any, list]:
    """A vllm_request_output array for the engine's outputs, and every cdata it points
    into. Counts output tokens and forgets finished requests."""
    array = ffi.new("vllm_request_output[]", len(results))
    memory = [array]
    for i, result in enumerate(results):
        completion, out = result.outputs[0], array[i]
        rid = ffi.new("char[]", result.request_id.encode("utf-8"))
        text = ffi.new("char[]", completion.text.encode("utf-8", "replace"))
        ids = ffi.new("int32_t[]", completion.token_ids)
        memory += [rid, text, ids]
        record.requests[result.request_id] += len(completion.token_ids)
        out.request_id, out.text = rid, text
        out.token_ids, out.n_token_ids = ids, len(completion.token_ids)
        out.finished = int(result.finished)
        out.finish_reason = _FINISH_REASONS[completion.finish_reason]
        out.num_prompt_tokens = len(result.prompt_token_ids)
        out.num_output_tokens = record.requests[result.request_id]
        if result.finished:
            del record.requests[result.request_id]
    return array, memory


@_export
def glue_engine_step(key, outputs, n_outputs) -> None:
    record = _record(key)
    record.step_memory = []  # the previous step's outputs are no longer valid
    results = record.engine.step() if record.engine.has_unfinished_requests() else []
    if results:
        array, record.step_memory = _step_outputs(record, results)
        outputs[0], n_outputs[0] = array, len(results)


@_export
def glue_engine_num_unfinished(key, n) -> None:
    n[0] = len(_record(key).requests)


_quiet_embedded_interpreter()
