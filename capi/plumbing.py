"""capi.plumbing: what every glue module shares.

- export: registers a Python function as the body of the glue_* function of the same
  name (capi/glue.h) and maps exceptions to vllm.h status codes: a VllmError gives its
  `.status` and message (EndOfStream: its status alone, it is no error), anything else
  VLLM_ERR_INTERNAL. No traceback ever reaches the
  host's terminal.
- Handle registries: small integer keys, one counter for every kind of handle, so a
  stale key or a key of another kind is VLLM_ERR_INVALID_HANDLE, never a crash.
- The engine handle: an engine.session.EngineSession (the engine, its loop, lock,
  stats, timings) and the C memory handed out for it.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field

import numpy as np
from _libvllm import ffi, lib

from libvllm.engine.session import (
    EngineSession,
    InvalidArgumentError,
    OutOfResourcesError,
    RepetitionDetectionParams,
    RequestOutputKind,
    SamplingParams,
    StructuredOutputsParams,
    VllmError,
    check_num_logprob_token_ids,
)


class BufferTooSmallError(VllmError):
    status = lib.VLLM_ERR_BUFFER_TOO_SMALL


class InvalidHandleError(VllmError):
    status = lib.VLLM_ERR_INVALID_HANDLE


class TimeoutStatus(VllmError):
    status = lib.VLLM_ERR_TIMEOUT


class EndOfStream(VllmError):
    status = lib.VLLM_END_OF_STREAM


def set_error(status: int, message: str) -> int:
    lib.glue_set_error(message.encode("utf-8", "replace"))
    return status


def _internal_error(exc: BaseException) -> int:
    return set_error(lib.VLLM_ERR_INTERNAL, f"internal error: {type(exc).__name__}: {exc}")


def _uncaught(exc_type, exc, traceback) -> None:
    """cffi's last resort (when export's own handler fails): record, never print."""
    _internal_error(exc)


def export(fn):
    """Registers fn as the Python body of the glue_* function of the same name."""

    @functools.wraps(fn)
    def call(*args):
        try:
            fn(*args)
        except EndOfStream:  # vllm.h: not an error, so no message
            return lib.VLLM_END_OF_STREAM
        except VllmError as e:
            return set_error(e.status, str(e) or type(e).__name__)
        except BaseException as e:
            return _internal_error(e)
        return lib.VLLM_OK

    ffi.def_extern(name=fn.__name__, error=lib.VLLM_ERR_INTERNAL, onerror=_uncaught)(call)
    return call


def text(ptr, what: str) -> str:
    try:
        return ffi.string(ptr).decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidArgumentError(f"{what} is not valid UTF-8: {e}") from None


def optional_text(ptr, what: str) -> str | None:
    return None if ptr == ffi.NULL else text(ptr, what)


def c_string(value: str):
    """A malloc'd copy of value for the caller to free with vllm_string_free."""
    data = value.encode("utf-8", "replace")
    copy = lib.glue_strndup(data, len(data))
    if copy == ffi.NULL:
        raise OutOfResourcesError("out of memory copying a string for the caller")
    return copy


FINISH_REASONS = {
    None: lib.VLLM_FINISH_NONE,
    "stop": lib.VLLM_FINISH_STOP,
    "length": lib.VLLM_FINISH_LENGTH,
    "abort": lib.VLLM_FINISH_ABORT,
    "error": lib.VLLM_FINISH_ERROR,
    "repetition": lib.VLLM_FINISH_REPETITION,
}


def f32(value: float) -> float:
    """A C float as the short decimal its caller wrote (0.9f -> 0.9, not 0.8999999761)."""
    return float(str(np.float32(value)))


def sampling_params(p) -> SamplingParams:
    """vllm_sampling_params -> SamplingParams (DELTA outputs: what the ABI streams)."""
    check_num_logprob_token_ids(p.n_logprob_token_ids)  # before the ids are read
    return SamplingParams.from_optional(
        max_tokens=None if p.max_tokens < 0 else p.max_tokens,
        temperature=f32(p.temperature),
        top_p=f32(p.top_p),
        top_k=p.top_k,
        min_p=f32(p.min_p),
        seed=p.seed if p.has_seed else None,
        ignore_eos=bool(p.ignore_eos),
        stop_token_ids=list(p.stop_token_ids[0 : p.n_stop_token_ids]),
        skip_special_tokens=bool(p.skip_special_tokens),
        presence_penalty=f32(p.presence_penalty),
        frequency_penalty=f32(p.frequency_penalty),
        repetition_penalty=f32(p.repetition_penalty),
        min_tokens=p.min_tokens,
        stop=[text(p.stop[i], "params->stop[]") for i in range(p.n_stop)],
        include_stop_str_in_output=bool(p.include_stop_str_in_output),
        logit_bias={p.logit_bias_token_ids[i]: f32(p.logit_bias_values[i])
                    for i in range(p.n_logit_bias)} or None,
        allowed_token_ids=None if p.allowed_token_ids == ffi.NULL else list(
            p.allowed_token_ids[0 : p.n_allowed_token_ids]),
        bad_words=[text(p.bad_words[i], "params->bad_words[]") for i in range(p.n_bad_words)],
        structured_outputs=_structured_outputs(p),
        logprobs=None if p.logprobs == -1 else p.logprobs,  # vLLM checks the rest
        n=p.n,
        repetition_detection=_repetition_detection(p),
        thinking_token_budget=p.thinking_token_budget,  # -1: unlimited, as vLLM
        logprob_token_ids=list(p.logprob_token_ids[0:p.n_logprob_token_ids])
        if p.n_logprob_token_ids else None,
        output_kind=RequestOutputKind.DELTA,
    )


def _repetition_detection(p) -> RepetitionDetectionParams | None:
    """The repetition_* fields (since 1.2); None when all are 0."""
    sizes = (p.repetition_max_pattern_size, p.repetition_min_pattern_size,
             p.repetition_min_count)
    return RepetitionDetectionParams(*sizes) if any(sizes) else None


def _structured_outputs(p) -> StructuredOutputsParams | None:
    """The typed structured-output fields (since 0.3); None when none is set."""
    values = {name: optional_text(getattr(p, field), f"params->{field}")
              for name, field in (("json", "json_schema"), ("regex", "regex"),
                                  ("grammar", "grammar"), ("structural_tag", "structural_tag"))}
    if p.n_choice:
        values["choice"] = [text(p.choice[i], "params->choice[]") for i in range(p.n_choice)]
    if p.json_object:
        values["json_object"] = True
    values = {k: v for k, v in values.items() if v is not None}
    return StructuredOutputsParams(**values) if values else None


def prompt_arg(prompt, prompt_token_ids, n_prompt_token_ids) -> str | list[int]:
    if prompt != ffi.NULL:
        return text(prompt, "prompt")
    return list(prompt_token_ids[0:n_prompt_token_ids])


_keys = itertools.count(1)


class Registry(dict):
    """key -> object for one kind of handle."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def add(self, obj) -> int:
        key = next(_keys)  # atomic under the GIL
        self[key] = obj
        return key

    def get_live(self, key: int):
        try:
            return self[key]
        except KeyError:
            raise InvalidHandleError(
                f"invalid {self.kind} handle {key:#x} (freed or never created)") from None

    def take(self, key: int):
        obj = self.pop(key, None)
        if obj is None:
            raise InvalidHandleError(
                f"invalid {self.kind} handle {key:#x} (freed or never created)")
        return obj


def copy_out(data: bytes, buf, capacity: int, n_bytes) -> None:
    """Two-call sizing: *n_bytes = len(data); data + NUL into buf if it fits."""
    n_bytes[0] = len(data)
    if len(data) + 1 > capacity:
        raise BufferTooSmallError(f"{len(data)} bytes and a NUL do not fit in capacity {capacity}")
    ffi.memmove(buf, data + b"\0", len(data) + 1)


@dataclass
class EngineHandle:
    """What a vllm_engine handle stands for: the engine session, and the C memory the
    ABI hands out for it."""

    session: EngineSession
    step_memory: dict[int, list] = field(default_factory=dict)  # thread -> cdata of its
    # last vllm_engine_step's outputs (alive until that thread's next step)
    info: dict | None = None  # cdata behind vllm_model_info's strings and arrays


engines = Registry("engine")
