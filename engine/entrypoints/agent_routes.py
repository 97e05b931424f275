"""The routes of the agent APIs: OpenAI's Responses API and Anthropic's Messages API.

POST /v1/responses, GET /v1/responses/{id}, POST /v1/responses/{id}/cancel
(vllm/entrypoints/openai/responses/api_router.py) and POST /v1/messages,
POST /v1/messages/count_tokens (vllm/entrypoints/anthropic/api_router.py). Each API
answers errors in its own shape: OpenAI's {"error": {...}}, Anthropic's {"type": "error",
"error": {"type", "message"}} with the same HTTP status. A streamed answer is a
ChunkStream of event JSON, each with its event name in "type" (the server sends it as the
SSE `event:` line).
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

from pydantic import TypeAdapter

from libvllm.engine.entrypoints.anthropic import protocol as anthropic
from libvllm.engine.entrypoints.anthropic.serving import MessagesJob, count_tokens
from libvllm.engine.entrypoints.openai.chunk_stream import ChunkStream
from libvllm.engine.entrypoints.openai.errors import error_json
from libvllm.engine.entrypoints.openai.responses.protocol import ResponsesRequest
from libvllm.engine.entrypoints.openai.responses.serving import (
    ResponsesJob,
    cancel_response,
    retrieve_response,
)
from libvllm.engine.entrypoints.openai.responses.store import store_for
from libvllm.engine.entrypoints.openai.serving_engine import ServingContext

PREFIXES = ("/v1/responses", "/v1/messages")
_JSON = TypeAdapter(Any)


def _generate(job, stream: bool, on_error) -> tuple[int, str | None, ChunkStream | None]:
    if stream:
        return 200, None, ChunkStream(job, on_error)
    try:
        return 200, job.response(), None
    finally:
        job.merged.close()


def _responses(ctx: ServingContext, method: str, parts: list[str], body: str):
    store = store_for(ctx.client)
    if parts == [] and method == "POST":
        request = ResponsesRequest.model_validate(_JSON.validate_json(body or ""))
        return _generate(ResponsesJob(ctx, request, store), bool(request.stream),
                         lambda exc: error_json(exc)[1])
    if len(parts) == 1 and method == "GET":
        return 200, retrieve_response(store, parts[0]), None
    if len(parts) == 2 and parts[1] == "cancel" and method == "POST":
        return 200, cancel_response(store, parts[0]), None
    return None


def _messages(ctx: ServingContext, method: str, parts: list[str], body: str):
    if method != "POST" or parts not in ([], ["count_tokens"]):
        return None
    data = _JSON.validate_json(body or "")
    if parts:
        return 200, count_tokens(ctx, anthropic.CountTokensRequest.model_validate(data)), None
    request = anthropic.MessagesRequest.model_validate(data)
    return _generate(MessagesJob(ctx, request), bool(request.stream),
                     lambda exc: json.dumps(anthropic.error_body(exc)[1]))


def agent_request(client, method: str, path: str, body: str,
                  served_model_name: str) -> tuple[int, str | None, ChunkStream | None]:
    """(HTTP status, body, stream) of one request under PREFIXES; exactly one of body and
    stream is set. Errors come back as the API's error body, never as exceptions."""
    messages = path.startswith("/v1/messages")
    prefix = PREFIXES[1] if messages else PREFIXES[0]
    rest = path[len(prefix):]
    fail = anthropic.error_json if messages else error_json
    if rest and not rest.startswith("/"):
        return _not_found(messages)
    parts = [p for p in rest.split("/") if p] if rest else []
    try:
        ctx = ServingContext(client, served_model_name)
        result = (_messages if messages else _responses)(ctx, method.upper(), parts, body)
        return result if result is not None else _not_found(messages)
    except Exception as exc:  # noqa: BLE001 - every failure is the API's error body
        status, text = fail(exc)
        return status, text, None


def _not_found(messages: bool) -> tuple[int, str, None]:
    status = HTTPStatus.NOT_FOUND
    body = {"type": "error", "error": {"type": "not_found_error", "message": status.phrase}} \
        if messages else {"error": {"message": status.phrase, "type": status.phrase,
                                    "param": None, "code": status.value}}
    return int(status), json.dumps(body), None
