"""The ASGI app: routing, API keys, admission, SSE framing, /health, /version, /metrics.

HTTP only: the OpenAI work happens in libvllm (vllm_openai_request), reached through
libvllm_ctypes.py. Mirrors the HTTP behaviour of vllm/entrypoints/serve/** (routes, error body
{"error": {message, type, param, code}}, 503 "Service Unavailable" for a full queue as
vLLM's QueueOverflowError, SSE `data: <chunk>\\n\\n` ... `data: [DONE]\\n\\n`) with the
auth rule of llama.cpp: default-deny, every path needs the key except PUBLIC_PATHS.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
from http import HTTPStatus

import anyio
from idle_trim import IdleTrim
from libvllm_ctypes import LibVLLM, VllmError
from limits import BodyError, read_body
from metrics import render
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

logger = logging.getLogger("vllm.server")

AGENT_ROUTES = {"/v1/responses": "POST", "/v1/responses/{response_id}": "GET",
                "/v1/responses/{response_id}/cancel": "POST", "/v1/messages": "POST",
                "/v1/messages/count_tokens": "POST"}  # {..}: a Starlette path parameter
POOLING_ROUTES = {"/v1/embeddings": "POST", "/pooling": "POST", "/score": "POST",
                  "/v1/score": "POST", "/rerank": "POST", "/v1/rerank": "POST",
                  "/v2/rerank": "POST"}  # served by a --runner pooling engine
PUBLIC_PATHS = frozenset({"/health", "/version"})  # liveness and version: no data, no key
OPENAI_ROUTES = {"/v1/completions": "POST", "/v1/chat/completions": "POST",
                 "/v1/models": "GET", "/tokenize": "POST", "/detokenize": "POST",
                 **AGENT_ROUTES, **POOLING_ROUTES}
STREAM_POLL_MS = 250  # how often a silent stream looks for a disconnected client
_BUSY = ("The engine is currently busy and cannot accept new requests. Please try again later "
         "or on a different instance.")


# vllm.h status -> (HTTP status, OpenAI error type): vLLM's semantics (400 a client mistake,
# 404 not found, 413 too large, 501 not implemented, 503 the engine cannot serve now);
# 500 only for VLLM_ERR_INTERNAL (a bug) and codes this table does not know.
STATUS_TO_HTTP = {
    1: (400, "BadRequestError"),  # VLLM_ERR_INVALID_ARGUMENT: e.g. a body that is not UTF-8
    2: (413, "RequestEntityTooLarge"),  # VLLM_ERR_BUFFER_TOO_SMALL
    3: (503, "ServiceUnavailableError"),  # VLLM_ERR_MODEL_LOAD
    4: (501, "NotImplementedError"),  # VLLM_ERR_UNSUPPORTED
    5: (404, "NotFoundError"),  # VLLM_ERR_NOT_FOUND
    6: (503, "ServiceUnavailableError"),  # VLLM_ERR_INVALID_HANDLE: the engine was freed
    7: (503, "ServiceUnavailableError"),  # VLLM_ERR_OUT_OF_RESOURCES
    8: (503, "ServiceUnavailableError"),  # VLLM_ERR_RUNTIME_INIT
    9: (500, "InternalServerError"),  # VLLM_ERR_INTERNAL
    10: (503, "ServiceUnavailableError"),  # VLLM_ERR_TIMEOUT
    12: (503, "ServiceUnavailableError"),  # VLLM_ERR_INVALID_STATE: e.g. shutting down
    13: (503, "ServiceUnavailableError"),  # VLLM_ERR_CANCELLED: a load the caller stopped
    14: (503, "ServiceUnavailableError"),  # VLLM_ERR_ENGINE_DEAD: vLLM's /health 503
}


class ServerState:
    def __init__(self, lib: LibVLLM, model_name: str, max_queued: int,
                 body_timeout_s: float = 30.0) -> None:
        self.lib, self.model_name, self.max_queued = lib, model_name, max_queued
        self.body_timeout_s = body_timeout_s  # the longest wait for the next body bytes
        self.ready = False  # the engine is loaded and its loop runs
        self.draining = False  # SIGTERM: no new requests, in-flight ones finish
        self.in_flight = 0
        self.trim = IdleTrim()  # freed heap back to the OS once no request runs
        self.streams: set[int] = set()
        self.limiter = anyio.CapacityLimiter(max_queued + 8)  # threads blocked in libvllm

    def enter(self) -> None:
        self.in_flight += 1
        self.trim.busy()

    def leave(self) -> None:
        self.in_flight -= 1
        if not self.in_flight:
            self.trim.idle()


def error_response(status: int, message: str, err_type: str | None = None,
                   headers: dict | None = None) -> JSONResponse:
    err_type = err_type or HTTPStatus(status).phrase
    body = {"error": {"message": message, "type": err_type, "param": None, "code": status}}
    return JSONResponse(body, status_code=status, headers=headers)


def unavailable(message: str) -> JSONResponse:
    return error_response(503, message, headers={"Retry-After": "1"})


class ApiKeyMiddleware:
    """Bearer token (or X-Api-Key) on every path but PUBLIC_PATHS; compared in constant
    time on SHA-256 digests, as vllm/entrypoints/serve/middleware/authenticate.py."""

    def __init__(self, app, api_keys: list[str]) -> None:
        self.app = app
        self.digests = [hashlib.sha256(k.encode()).digest() for k in api_keys]

    def _authorized(self, headers: Headers) -> bool:
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            token = headers.get("x-api-key", "")
        digest = hashlib.sha256(token.strip().encode()).digest()
        return bool(token) and any(secrets.compare_digest(digest, d) for d in self.digests)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and self.digests and scope["path"] not in PUBLIC_PATHS \
                and not self._authorized(Headers(scope=scope)):
            response = error_response(401, "Invalid or missing API key.", "authentication_error",
                                      {"WWW-Authenticate": "Bearer"})
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


async def openai_endpoint(request: Request) -> Response:
    st: ServerState = request.app.state.server
    if not st.ready:
        return unavailable("The model is loading." if not st.draining else "Shutting down.")
    if st.draining:
        return unavailable("The server is shutting down.")
    if st.in_flight >= st.max_queued:
        return unavailable(_BUSY)
    if request.method == "POST" and \
            request.headers.get("content-type", "").split(";")[0].strip().lower() != \
            "application/json":  # vLLM's validate_json_request
        return error_response(400, "1 validation error:\n  Unsupported Media Type: Only "
                              "'application/json' is allowed")
    st.enter()
    handed_over = False
    try:
        body = await read_body(request, st.body_timeout_s) if request.method == "POST" else None
        status, text, stream = await anyio.to_thread.run_sync(
            st.lib.openai_request, request.method, request.url.path, body, True,
            limiter=st.limiter)
        if stream is None:
            return Response(text, status_code=status, media_type="application/json")
        if status == 0:  # a deferred non-streamed response: cancelled if the client leaves
            return await _deferred(st, request, stream)
        handed_over = True
        return StreamingResponse(_sse(st, stream), status_code=status,
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    except BodyError as exc:
        return error_response(exc.status, str(exc), headers={"Connection": "close"})
    except VllmError as exc:
        return vllm_error_response(exc)
    finally:
        if not handed_over:
            st.leave()


def vllm_error_response(exc: VllmError) -> JSONResponse:
    """A failed vllm.h call as its HTTP status (STATUS_TO_HTTP)."""
    code, err_type = STATUS_TO_HTTP.get(exc.status, (500, "InternalServerError"))
    (logger.error if code >= 500 else logger.info)("libvllm refused: %s", exc)
    return error_response(code, exc.message, err_type)


async def _deferred(st: ServerState, request: Request, stream: int) -> Response:
    """Waits for the one chunk of a deferred response, polling for a client that left:
    then the handle is freed at once, which aborts the engine requests (vLLM's
    with_cancellation)."""
    st.streams.add(stream)
    try:
        while True:
            try:
                chunk = await anyio.to_thread.run_sync(
                    st.lib.stream_next, stream, STREAM_POLL_MS, limiter=st.limiter)
            except VllmError as exc:
                return vllm_error_response(exc)
            except EOFError:
                logger.error("libvllm ended a deferred response without its body")
                return error_response(500, "The response ended without a body.")
            if chunk is not None:
                code = json.loads(chunk)["error"]["code"] if chunk.startswith('{"error"') \
                    else 200
                return Response(chunk, status_code=code, media_type="application/json")
            if await request.is_disconnected():
                logger.info("client disconnected: its request is aborted")
                return Response(status_code=499)  # nobody reads it
    finally:
        st.streams.discard(stream)
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(st.lib.stream_free, stream, limiter=st.limiter)


async def _sse(st: ServerState, stream: int):
    """The chunks as SSE events. However it ends (done, client gone, shutdown) the engine
    requests are cancelled if unfinished and the handle is freed. A chunk that is ready
    is taken on the event loop (a look, timeout 0); only a wait goes to a worker thread,
    so a stream that lags behind the engine costs no thread hop per chunk."""
    st.streams.add(stream)
    named = False  # events that name themselves end without [DONE], as vLLM's
    try:
        while True:
            try:
                chunk = st.lib.stream_next(stream, 0)
                if chunk is None:
                    chunk = await anyio.to_thread.run_sync(
                        st.lib.stream_next, stream, STREAM_POLL_MS, limiter=st.limiter)
            except EOFError:
                if not named:
                    yield b"data: [DONE]\n\n"
                return
            except VllmError as exc:  # libvllm failed mid-stream: vLLM's error event
                logger.error("libvllm failed mid-stream: %s", exc)
                code, err_type = STATUS_TO_HTTP.get(exc.status, (500, "InternalServerError"))
                error = {"message": exc.message, "type": err_type, "param": None, "code": code}
                yield b"data: " + json.dumps({"error": error}).encode() + b"\n\ndata: [DONE]\n\n"
                return
            if chunk is not None:
                event = sse_event(chunk)
                named = named or bool(event)
                yield event + b"data: " + chunk.encode() + b"\n\n"
    finally:
        st.streams.discard(stream)
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(st.lib.stream_free, stream, limiter=st.limiter)
        st.leave()


def sse_event(chunk: str) -> bytes:
    """The `event:` line of an event that names itself ({"type": "<event>", ...}: the
    Responses and Messages APIs, as vLLM frames them); none for chat / completion chunks."""
    if not chunk.startswith('{"type": "'):
        return b""
    return b"event: " + chunk[10:chunk.index('"', 10)].encode() + b"\n"


async def health(request: Request) -> Response:
    """vLLM's /health through libvllm (the OpenAI entry's GET /health, which asks the
    engine's check_health and waits for no step): 200, or 503 once the engine died; 503
    while the model loads or the server drains."""
    st: ServerState = request.app.state.server
    if not st.ready or st.draining:
        return Response(status_code=503)
    try:
        status, text, _ = await anyio.to_thread.run_sync(
            st.lib.openai_request, "GET", "/health", None, limiter=st.limiter)
    except VllmError as exc:  # e.g. the engine was freed
        return vllm_error_response(exc)
    if status == 200:
        return Response(status_code=200)
    return Response(text, status_code=status, media_type="application/json")


async def version(request: Request) -> Response:
    return JSONResponse({"version": request.app.state.server.lib.version()})


async def metrics(request: Request) -> Response:
    st: ServerState = request.app.state.server
    if not st.ready:
        return unavailable("The model is loading.")
    try:
        values = await anyio.to_thread.run_sync(st.lib.metrics, limiter=st.limiter)
    except VllmError as exc:
        return vllm_error_response(exc)
    return Response(render(values, st.model_name),
                    media_type="text/plain; version=0.0.4; charset=utf-8")


async def _http_exception(request: Request, exc: HTTPException) -> Response:
    return error_response(exc.status_code, exc.detail)


def build_app(state: ServerState, api_keys: list[str], lifespan=None) -> Starlette:
    routes = [Route("/health", health, methods=["GET"]),
              Route("/version", version, methods=["GET"]),
              Route("/metrics", metrics, methods=["GET"])]
    routes += [Route(path, openai_endpoint, methods=[method])
               for path, method in OPENAI_ROUTES.items()]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={HTTPException: _http_exception})
    app.state.server = state
    app.add_middleware(ApiKeyMiddleware, api_keys=api_keys)
    return app
