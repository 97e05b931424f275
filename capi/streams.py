"""capi.streams: the background loop and per-request streaming of include/vllm.h
(vllm_engine_start_loop, vllm_request_submit / _next / _cancel / _free).

The engine session (engine/session/) runs the loop and keeps each request's timings;
this module turns its DELTA RequestOutputs into events. Events are
built from DELTA RequestOutputs; an error that ends a request (the engine loop died)
becomes a last event with VLLM_FINISH_ERROR and its status and message. Push events are
valid during the callback only; a pulled event stays alive in its request record until
the next pull or free.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from _libvllm import ffi, lib

from libvllm.capi import typed_outputs
from libvllm.capi.generation_defaults import apply_generation_config
from libvllm.capi.plumbing import (
    FINISH_REASONS,
    EndOfStream,
    Registry,
    TimeoutStatus,
    engines,
    export,
    prompt_arg,
    sampling_params,
    text,
)
from libvllm.engine.session import InvalidStateError, RequestTimes, SubmittedRequest, VllmError

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
        event.e2e_latency = times.e2e_latency()
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


def _pusher(request_id: str, callback, user_data):
    """The push of a push-mode request: each output as events to callback."""

    def push(item, times: RequestTimes) -> None:
        for piece in _pieces(item):
            event, _memory = _event(request_id, piece, times)  # alive during the call
            lib.glue_emit_event(callback, event, user_data)

    return push


@dataclass
class _Request:
    submitted: SubmittedRequest
    backlog: deque = field(default_factory=deque)  # _pieces not pulled yet
    event_memory: list = field(default_factory=list)  # cdata of the last pulled event


_requests = Registry("request")


def forget_all() -> None:
    """vllm_shutdown: every request handle becomes stale."""
    _requests.clear()


@export
def glue_engine_start_loop(key) -> None:
    handle = engines.get_live(key)
    if handle.session.loop is None:
        handle.session.start_loop()
        handle.step_memory.clear()


@export
def glue_request_submit(key, request_id, prompt, prompt_token_ids, n_prompt_token_ids, params,
                        callback, user_data, out) -> None:
    session = engines.get_live(key).session
    session.require_loop("vllm_request_submit")
    rid = text(request_id, "request_id")
    apply_generation_config(params, session.default_sampling_params)  # since 1.3
    push = None if callback == ffi.NULL else _pusher(rid, callback, user_data)
    submitted = session.submit(rid, prompt_arg(prompt, prompt_token_ids, n_prompt_token_ids),
                               sampling_params(params), push=push, pulled=out != ffi.NULL)
    if out != ffi.NULL:
        out[0] = _requests.add(_Request(submitted))


@export
def glue_request_next(key, timeout_ms, event) -> None:
    request = _requests.get_live(key)
    stream = request.submitted.stream
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
    event[0], request.event_memory = _event(stream.request_id, piece, request.submitted.times)
    if event[0].finished:
        request.submitted.last_event_taken()


@export
def glue_request_cancel(key) -> None:
    _requests.get_live(key).submitted.stream.cancel()


@export
def glue_request_free(key) -> None:
    request = _requests.take(key)
    request.submitted.stream.cancel()
    request.submitted.last_event_taken()
