"""capi.streams: the background loop and per-request streaming of include/vllm.h
(vllm_engine_start_loop, vllm_request_submit / _next / _cancel / _free).

The loop is engine.async_llm.AsyncLLM sharing the engine record's lock, so the
caller-driven functions and the loop never run the engine at the same time. Events are
built from DELTA RequestOutputs; an error that ends a request (the engine loop died)
becomes a last event with VLLM_FINISH_ERROR and its status and message. Push events are
valid during the callback only; a pulled event stays alive in its request record until
the next pull or free.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from _libvllm import ffi, lib

from capi import typed_outputs
from capi.generation_defaults import apply_generation_config
from capi.plumbing import (
    FINISH_REASONS,
    EndOfStream,
    EngineRecord,
    InvalidStateError,
    Registry,
    TimeoutStatus,
    engines,
    export,
    prompt_arg,
    sampling_params,
    text,
)
from capi.typed_outputs import RequestTimes
from engine.async_llm import AsyncLLM, RequestStream
from engine.errors import VllmError

_EMPTY = ffi.new("char[]", b"")


def error_status(error: BaseException | None) -> int:
    """The vllm_status of what ended a request (VLLM_OK: nothing did)."""
    if error is None:
        return lib.VLLM_OK
    return error.status if isinstance(error, VllmError) else lib.VLLM_ERR_INTERNAL


def error_message(error: BaseException) -> bytes:
    return (str(error) or type(error).__name__).encode("utf-8", "replace")


def _pieces(item) -> list[tuple]:
    """(item, completion or None, last) per event of a RequestOutput (one per sequence:
    with n > 1 an output may hold several) or of the exception that ended the request."""
    if isinstance(item, BaseException):
        return [(item, None, True)]
    return [(item, completion, item.finished and i == len(item.outputs) - 1)
            for i, completion in enumerate(item.outputs)]


def _event(request_id: str, piece: tuple, times: RequestTimes) -> tuple[object, list]:
    """A vllm_event for one of _pieces and the cdata it points into."""
    item, completion, last = piece
    event = ffi.new("vllm_event *")
    rid = ffi.new("char[]", request_id.encode("utf-8"))
    memory = [event, rid]
    event.struct_size = ffi.sizeof("vllm_event")
    event.request_id, event.text, event.error = rid, _EMPTY, _EMPTY
    if isinstance(item, BaseException):
        message = ffi.new("char[]", error_message(item))
        memory.append(message)
        event.finished, event.finish_reason = 1, lib.VLLM_FINISH_ERROR
        event.status, event.error = error_status(item), message
        event.num_output_tokens = sum(times.num_output_tokens.values())
        event.arrival_time = times.arrival_time
        event.first_token_latency = times.first_token_latency.get(0, 0.0)
        event.e2e_latency = time.monotonic() - times.arrival_mono
    else:
        delta = ffi.new("char[]", completion.text.encode("utf-8", "replace"))
        ids = ffi.new("int32_t[]", completion.token_ids)
        memory += [delta, ids]
        times.num_prompt_tokens = len(item.prompt_token_ids)
        num_output_tokens, latency = times.observe(completion)
        typed_outputs.fill(event, completion, latency, times, last, memory)
        event.text, event.token_ids, event.n_token_ids = delta, ids, len(completion.token_ids)
        event.finished = int(last)
        event.finish_reason = FINISH_REASONS[completion.finish_reason]
        event.num_cached_tokens = item.num_cached_tokens
        event.num_output_tokens = num_output_tokens
    event.num_prompt_tokens = times.num_prompt_tokens
    return event, memory


def _pusher(request_id: str, times: RequestTimes, callback, user_data):
    """The on_output of a push-mode request: each output as events to callback."""

    def on_output(item) -> None:
        for piece in _pieces(item):
            event, _memory = _event(request_id, piece, times)  # alive during the call
            lib.glue_emit_event(callback, event, user_data)

    return on_output


@dataclass
class _Request:
    stream: RequestStream
    record: EngineRecord
    times: RequestTimes
    backlog: deque = field(default_factory=deque)  # _pieces not pulled yet
    event_memory: list = field(default_factory=list)  # cdata of the last pulled event

    def last_event_taken(self) -> None:
        """Its last event was pulled, or the handle freed: no longer unfinished."""
        self.record.awaiting_last_event.pop(id(self), None)


def num_unfinished(record: EngineRecord) -> int:
    """vllm_engine_num_unfinished of a looping engine: requests in the loop, plus pulled
    ones whose last event waits to be pulled."""
    waiting = sum(1 for rid in record.awaiting_last_event.values()
                  if not record.loop.has_request(rid))
    return record.loop.num_unfinished() + waiting


_requests = Registry("request")


def forget_all() -> None:
    """vllm_shutdown: every request handle becomes stale."""
    _requests.clear()


@export
def glue_engine_start_loop(key) -> None:
    record = engines.get_live(key)
    with record.lock:
        if record.loop is not None:
            return
        if record.requests:
            raise InvalidStateError(
                f"{len(record.requests)} request(s) added with vllm_request_add are unfinished:"
                " step or abort them before vllm_engine_start_loop")
        record.step_memory.clear()
        record.loop = AsyncLLM(record.engine, stats=record.stats, lock=record.lock)


@export
def glue_request_submit(key, request_id, prompt, prompt_token_ids, n_prompt_token_ids, params,
                        callback, user_data, out) -> None:
    record = engines.get_live(key)
    loop = record.require_loop("vllm_request_submit")
    rid = text(request_id, "request_id")
    apply_generation_config(params, record.engine.default_sampling_params)  # since 1.3
    sampling = sampling_params(params)
    times = RequestTimes.for_params(sampling)
    on_output = None if callback == ffi.NULL else _pusher(rid, times, callback, user_data)
    stream = loop.add_request(rid, prompt_arg(prompt, prompt_token_ids, n_prompt_token_ids),
                              sampling, on_output=on_output)
    if out != ffi.NULL:
        request = _Request(stream, record, times)
        if on_output is None:
            record.awaiting_last_event[id(request)] = rid
        out[0] = _requests.add(request)


@export
def glue_request_next(key, timeout_ms, event) -> None:
    request = _requests.get_live(key)
    stream = request.stream
    if stream.pushes:
        raise InvalidStateError(f"request {stream.request_id!r} streams to its callback")
    if not request.backlog:
        try:
            item = stream.get(None if timeout_ms < 0 else timeout_ms / 1000)
        except EOFError:
            raise EndOfStream(f"request {stream.request_id!r} has ended") from None
        except Exception as e:  # the error that ended the request: its last event
            item = e
        if item is None:
            raise TimeoutStatus(
                f"no event of request {stream.request_id!r} within {timeout_ms} ms")
        request.backlog.extend(_pieces(item))
    piece = request.backlog.popleft()
    event[0], request.event_memory = _event(stream.request_id, piece, request.times)
    if event[0].finished:
        request.last_event_taken()


@export
def glue_request_cancel(key) -> None:
    _requests.get_live(key).stream.cancel()


@export
def glue_request_free(key) -> None:
    request = _requests.take(key)
    request.stream.cancel()
    request.last_event_taken()
