"""handle_openai_request: one OpenAI HTTP request (method, path, JSON body) -> a result.

The entry point of the OpenAI layer that include/vllm.h exposes (vllm_openai_request). It
routes as vllm/entrypoints/launchers/api_server/routers.py registers the routes, and returns
either a complete JSON body with its HTTP status, or a ChunkStream of chunk JSON that the
caller frames as SSE (`data: <chunk>\\n\\n`, then `data: [DONE]\\n\\n`). A failure after the
stream started is sent as one `{"error": ...}` chunk, as vLLM does. GET /health asks the
engine client's check_health (vLLM's health route), waiting for no step.
"""

from __future__ import annotations

import json
import queue
import threading
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from pydantic import TypeAdapter

from libvllm.engine.entrypoints.agent_routes import PREFIXES as AGENT_PREFIXES
from libvllm.engine.entrypoints.agent_routes import agent_request
from libvllm.engine.entrypoints.openai.chat_protocol import ChatCompletionRequest
from libvllm.engine.entrypoints.openai.chunk_stream import ChunkStream
from libvllm.engine.entrypoints.openai.completion_protocol import CompletionRequest
from libvllm.engine.entrypoints.openai.errors import error_json
from libvllm.engine.entrypoints.openai.serving_chat import ChatJob
from libvllm.engine.entrypoints.openai.serving_completion import CompletionJob
from libvllm.engine.entrypoints.openai.serving_engine import ServingContext
from libvllm.engine.entrypoints.openai.serving_models import show_available_models
from libvllm.engine.entrypoints.openai.serving_tokenize import create_detokenize, create_tokenize
from libvllm.engine.entrypoints.pooling_routes import pooling_request
from libvllm.engine.exceptions import EngineDeadError

_JSON = TypeAdapter(Any)
_GENERATE = {"/v1/completions": (CompletionRequest, CompletionJob),
             "/v1/chat/completions": (ChatCompletionRequest, ChatJob)}
_ROUTES = {"/v1/completions": "POST", "/v1/chat/completions": "POST", "/v1/models": "GET",
           "/tokenize": "POST", "/detokenize": "POST", "/health": "GET"}


class DeferredResponse:
    """A non-streamed response behind a stream handle (vllm.h VLLM_OPENAI_DEFER_RESPONSE),
    so that the caller can cancel it when its client leaves: one thread runs the job, get()
    returns its one chunk (the response or error body), then ""."""

    def __init__(self, job) -> None:
        self._job = job
        self._result: queue.Queue[str] = queue.Queue(maxsize=1)
        self._done = False
        threading.Thread(target=self._run, name="openai-deferred", daemon=True).start()

    def _run(self) -> None:
        try:
            text = self._job.response()
        except Exception as exc:  # noqa: BLE001 - becomes the error body
            text = error_json(exc)[1]
        finally:
            self._job.merged.close()
        self._result.put(text)

    def get(self, timeout_s: float | None) -> str | None:
        if self._done:
            return ""
        try:
            text = self._result.get(timeout=timeout_s)
        except queue.Empty:
            return None
        self._done = True
        return text

    def cancel(self) -> None:
        self._job.merged.cancel()


@dataclass
class OpenAIResult:
    status: int
    body: str | None = None  # exactly one of body / stream is set
    stream: ChunkStream | DeferredResponse | None = None


def _http_error(status: HTTPStatus) -> OpenAIResult:
    error = {"message": status.phrase, "type": status.phrase, "param": None,
             "code": status.value}
    return OpenAIResult(int(status), json.dumps({"error": error}))


def _health(client) -> OpenAIResult:
    """vllm/entrypoints/serve/instrumentator/health.py: check_health() -> 200 with an
    empty body, EngineDeadError -> 503 (with the error body). Waits for nothing."""
    try:
        client.check_health()
    except EngineDeadError as exc:
        error = {"message": str(exc), "type": "ServiceUnavailableError", "param": None,
                 "code": 503}
        return OpenAIResult(503, json.dumps({"error": error}))
    return OpenAIResult(200, "")


def handle_openai_request(client, method: str, endpoint: str, body: str, *,
                          served_model_name: str, defer: bool = False) -> OpenAIResult:
    """Serves one request. `client` is an engine.async_llm.AsyncLLM (or an object with its
    interface); errors come back as OpenAI error bodies, never as exceptions. defer: a
    non-streamed generation comes back as a DeferredResponse (status 0)."""
    path = endpoint.split("?", 1)[0]
    if (pooled := pooling_request(client, method, path, body, served_model_name)) is not None:
        return OpenAIResult(*pooled)  # /v1/embeddings, /pooling, /score, /rerank
    if path.startswith(AGENT_PREFIXES):  # /v1/responses*, /v1/messages*
        return OpenAIResult(*agent_request(client, method, path, body, served_model_name))
    if path not in _ROUTES:
        return _http_error(HTTPStatus.NOT_FOUND)
    if method.upper() != _ROUTES[path]:
        return _http_error(HTTPStatus.METHOD_NOT_ALLOWED)
    if path == "/health":
        return _health(client)
    try:
        ctx = ServingContext(client, served_model_name)
        if path == "/v1/models":
            return OpenAIResult(200, show_available_models(ctx))
        data = _JSON.validate_json(body or "")
        if path == "/tokenize":
            return OpenAIResult(200, create_tokenize(ctx, data))
        if path == "/detokenize":
            return OpenAIResult(200, create_detokenize(ctx, data))
        model, job_cls = _GENERATE[path]
        request = model.model_validate(data)
        job = job_cls(ctx, request)
        if request.stream:
            return OpenAIResult(200, stream=ChunkStream(job))
        if defer:
            return OpenAIResult(0, stream=DeferredResponse(job))
        try:
            return OpenAIResult(200, job.response())
        finally:
            job.merged.close()
    except Exception as exc:  # noqa: BLE001 - every failure is an OpenAI error body
        status, text = error_json(exc)
        return OpenAIResult(status, text)
