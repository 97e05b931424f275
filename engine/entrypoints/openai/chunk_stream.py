"""ChunkStream: the chunks of one streamed answer, pulled by the caller of
vllm_openai_request (include/vllm.h) one get() at a time.

Serves every streamed route: /v1/completions and /v1/chat/completions (api.py), /v1/responses
and /v1/messages (agent_routes.py); each API turns a failure after the stream started into its
own error chunk. Where vLLM's FastAPI StreamingResponse iterates the serving generators
(vllm/entrypoints/openai/chat_completion/serving.py chat_completion_stream_generator), the
caller here drives the generator, each get() bounded by a StreamClock deadline.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from libvllm.engine.entrypoints.openai.accumulate import StreamClock
from libvllm.engine.entrypoints.openai.errors import error_json


def _openai_error_chunk(exc: BaseException) -> str:
    return error_json(exc)[1]


class ChunkStream:
    """The chunks of one streaming response. get() and cancel() may run on different
    threads; a get() that finds another get() running returns None (as a timeout), so
    two callers of one handle can never run its generator at once. on_error: the chunk that
    ends the stream when the generator raises (default: the OpenAI error body)."""

    def __init__(self, job,
                 on_error: Callable[[BaseException], str] = _openai_error_chunk) -> None:
        self._job, self._on_error = job, on_error
        self._clock = StreamClock()
        self._chunks = job.chunks(self._clock)
        self._done = threading.Event()
        self._getting = threading.Lock()

    def get(self, timeout_s: float | None) -> str | None:
        """The next chunk's JSON; None if none came within timeout_s; "" at the end."""
        if self._done.is_set():
            return ""
        if not self._getting.acquire(blocking=False):
            return None
        try:
            self._clock.start(timeout_s)
            return next(self._chunks)
        except StopIteration:
            self._finish()
            return ""
        except Exception as exc:  # noqa: BLE001 - becomes the stream's error event
            self._finish()
            return self._on_error(exc)
        finally:
            self._getting.release()

    def cancel(self) -> None:
        """Aborts the engine requests (a client that went away); get() then ends the stream."""
        self._job.merged.cancel()

    def _finish(self) -> None:
        self._done.set()
        self._job.merged.close()
