"""capi.openai_glue: vllm_openai_request and the vllm_openai_stream_* functions.

vllm_openai_request_len (since 0.5) passes the body with its length (a NUL byte is part
of it) and may defer a non-streamed response behind a stream handle so that it can be
cancelled. Thin: engine.entrypoints.openai.api.handle_openai_request does the OpenAI work on the
engine's AsyncLLM; this module checks the mode, converts strings, and keeps streamed
responses behind handles (a ChunkStream's "" is the end: VLLM_END_OF_STREAM).
"""

from __future__ import annotations

from dataclasses import dataclass

from _libvllm import ffi, lib

from libvllm.capi.plumbing import (
    EndOfStream,
    Registry,
    TimeoutStatus,
    c_string,
    engines,
    export,
    text,
)
from libvllm.engine.session import InvalidArgumentError, VllmError


@dataclass
class _Stream:
    chunks: object  # engine.entrypoints.openai.api.ChunkStream
    ended: bool = False


_streams = Registry("OpenAI stream")


def forget_all() -> None:
    """vllm_shutdown: every stream handle becomes stale."""
    _streams.clear()


def _body_text(body, body_size: int) -> str:
    """The body's body_size bytes (NUL bytes included) as text; not UTF-8: a 400."""
    try:
        return str(ffi.buffer(body, body_size), "utf-8")  # decoded in place: one pass
    except UnicodeDecodeError as e:
        raise InvalidArgumentError(f"body is not valid UTF-8: {e}") from None


@export
def glue_openai_request(key, method, endpoint, body, body_size, flags, http_status,
                        response_json, stream) -> None:
    from libvllm.engine.entrypoints.openai.api import handle_openai_request

    session = engines.get_live(key).session
    client = session.require_loop("vllm_openai_request")
    defer = {"defer": True} if flags & lib.VLLM_OPENAI_DEFER_RESPONSE else {}
    result = handle_openai_request(client, text(method, "method"), text(endpoint, "endpoint"),
                                   _body_text(body, body_size),
                                   served_model_name=session.served_model_name, **defer)
    if (result.body is None) == (result.stream is None):
        raise VllmError("the OpenAI layer must return exactly one of a body and a stream")
    if result.stream is not None:
        stream[0] = _streams.add(_Stream(result.stream))
    else:
        response_json[0] = c_string(result.body)
    http_status[0] = result.status


@export
def glue_openai_stream_next(key, timeout_ms, chunk_json) -> None:
    stream = _streams.get_live(key)
    if stream.ended:
        raise EndOfStream("the response is complete")
    chunk = stream.chunks.get(None if timeout_ms < 0 else timeout_ms / 1000)
    if chunk is None:
        raise TimeoutStatus(f"no chunk within {timeout_ms} ms")
    if chunk == "":
        stream.ended = True
        raise EndOfStream("the response is complete")
    chunk_json[0] = c_string(chunk)


@export
def glue_openai_stream_cancel(key) -> None:
    _streams.get_live(key).chunks.cancel()


@export
def glue_openai_stream_free(key) -> None:
    stream = _streams.take(key)
    if not stream.ended:
        stream.chunks.cancel()
