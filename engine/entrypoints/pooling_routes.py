"""The routes of a pooling engine, and which routes an engine of either runner serves.

POST /v1/embeddings (vllm/entrypoints/pooling/embed/api_router.py), /pooling
(pooling/api_router.py), /score, /v1/score, /rerank, /v1/rerank, /v2/rerank
(scoring/api_router.py). vLLM registers the routers of the tasks a model supports
(vllm/entrypoints/launchers/api_server/routers.py): a generate engine has no pooling
routes and a pooling engine no generation routes (completions, chat, responses,
messages); both answer 404 there, as an unregistered route does.
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

from pydantic import TypeAdapter

from libvllm.engine.entrypoints.openai.errors import error_json
from libvllm.engine.entrypoints.openai.pooling_protocol import (
    EmbeddingRequest,
    PoolingRequest,
    RerankRequest,
    ScoreRequest,
)
from libvllm.engine.entrypoints.openai.serving_engine import ServingContext
from libvllm.engine.entrypoints.openai.serving_pooling import (
    create_embedding,
    create_pooling,
    create_rerank,
    create_score,
)

POOLING_ROUTES = {
    "/v1/embeddings": (EmbeddingRequest, create_embedding),
    "/pooling": (PoolingRequest, create_pooling),
    "/score": (ScoreRequest, create_score), "/v1/score": (ScoreRequest, create_score),
    "/rerank": (RerankRequest, create_rerank), "/v1/rerank": (RerankRequest, create_rerank),
    "/v2/rerank": (RerankRequest, create_rerank),
}
GENERATE_PREFIXES = ("/v1/completions", "/v1/chat/completions", "/v1/responses",
                     "/v1/messages")
_JSON = TypeAdapter(Any)


def pooling_request(client, method: str, path: str, body: str, served_model_name: str
                    ) -> tuple[int, str, None] | None:
    """(HTTP status, body, None) of a pooling route, or the 404 of a route this engine's
    runner does not serve; None for the other routes (the caller serves them)."""
    pooling = getattr(getattr(client, "engine", None), "runner_type", None) == "pooling"
    if path not in POOLING_ROUTES:
        return _not_found() if pooling and path.startswith(GENERATE_PREFIXES) else None
    if not pooling:
        return _not_found()
    if method.upper() != "POST":
        status = HTTPStatus.METHOD_NOT_ALLOWED
        return int(status), _error_body(status), None
    model, serve = POOLING_ROUTES[path]
    try:
        request = model.model_validate(_JSON.validate_json(body or ""))
        return 200, serve(ServingContext(client, served_model_name), request), None
    except Exception as exc:  # noqa: BLE001 - every failure is an OpenAI error body
        status, text = error_json(exc)
        return status, text, None


def _not_found() -> tuple[int, str, None]:
    return int(HTTPStatus.NOT_FOUND), _error_body(HTTPStatus.NOT_FOUND), None


def _error_body(status: HTTPStatus) -> str:
    return json.dumps({"error": {"message": status.phrase, "type": status.phrase,
                                 "param": None, "code": status.value}})
