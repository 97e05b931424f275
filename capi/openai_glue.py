"""capi.openai_glue: vllm_openai_request and the vllm_openai_stream_* functions.

Thin: engine.entrypoints.openai.api.handle_openai_request does the OpenAI work on the
engine's AsyncLLM; this module checks the mode, converts strings, and keeps streamed
responses behind handles (a ChunkStream's "" is the end: VLLM_END_OF_STREAM).
"""

from __future__ import annotations

from dataclasses import dataclass

from capi.plumbing import (
    EndOfStream,
    Registry,
    TimeoutStatus,
    c_string,
    engines,
    export,
    text,
)
from engine.errors import VllmError


@dataclass
class _Stream:
    chunks: object  # engine.entrypoints.openai.api.ChunkStream
    ended: bool = False


_streams = Registry("OpenAI stream")


def forget_all() -> None:
    """vllm_shutdown: every stream handle becomes stale."""
    _streams.clear()


@export
def glue_openai_request(key, method, endpoint, body, http_status, response_json, stream) -> None:
    from engine.entrypoints.openai.api import handle_openai_request

    record = engines.get_live(key)
    client = record.require_loop("vllm_openai_request")
    result = handle_openai_request(client, text(method, "method"), text(endpoint, "endpoint"),
                                   text(body, "body"),
                                   served_model_name=record.served_model_name)
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
