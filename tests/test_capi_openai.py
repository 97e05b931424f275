"""The OpenAI entry points of include/vllm.h (vllm_openai_request and the
vllm_openai_stream_* functions), through build/libvllm.so loaded into this process.

First against a fake engine.entrypoints.openai.api that follows the agreed contract
(handle_openai_request(client, method, endpoint, body, *, served_model_name) ->
OpenAIResult with exactly one of body / stream; ChunkStream.get -> chunk, None on
timeout, "" at the end): statuses, chunks, END_OF_STREAM, timeout, cancel, free. Then
the real layer, for the plumbing only (its semantics have their own tests): greedy
completion text equal to the C API's vllm_engine_step text (the oracle), streaming, 4xx
bodies, and a cancelled stream counted as an aborted request.
"""

from __future__ import annotations

import json
import sys
import time
import types

import pytest
from test_capi_stream import PROMPT, looping_engine, open_library

pytestmark = [pytest.mark.capi, pytest.mark.slow]

api = pytest.fixture(scope="module")(open_library)
looping = pytest.fixture(scope="module")(looping_engine)


class FakeChunks:
    def __init__(self, chunks):
        self.chunks, self.cancelled = list(chunks), False

    def get(self, timeout_s):
        if self.cancelled:
            return ""
        return self.chunks.pop(0) if self.chunks else None

    def cancel(self):
        self.cancelled = True


@pytest.fixture
def fake_openai(monkeypatch):
    """engine.entrypoints.openai.api replaced by a fake following the agreed contract."""
    calls, made = [], []

    class OpenAIResult:
        def __init__(self, status, body, stream):
            self.status, self.body, self.stream = status, body, stream

    def handle_openai_request(client, method, endpoint, body, *, served_model_name):
        calls.append((type(client).__name__, method, endpoint, body, served_model_name))
        if endpoint == "/v1/models":
            return OpenAIResult(200, json.dumps({"data": [{"id": served_model_name}]}), None)
        if json.loads(body or "{}").get("stream"):
            made.append(FakeChunks(['{"n": 1}', '{"n": 2}', ""]))
            return OpenAIResult(200, None, made[-1])
        return OpenAIResult(400, '{"error": {"message": "bad"}}', None)

    module = types.ModuleType("libvllm.engine.entrypoints.openai.api")
    module.handle_openai_request = handle_openai_request
    monkeypatch.setitem(sys.modules, "libvllm.engine.entrypoints.openai.api", module)
    return calls, made


def _openai(api, engine, method, endpoint, body):
    ffi = api.ffi
    status, response, stream = ffi.new("int32_t *"), ffi.new("char **"), ffi.new(
        "vllm_openai_stream **")
    api.ok(api.lib.vllm_openai_request(engine, method, endpoint, body, status, response,
                                       stream))
    text = None
    if response[0] != ffi.NULL:
        text = ffi.string(response[0]).decode()
        api.lib.vllm_string_free(response[0])
    return status[0], text, stream[0]


def test_openai_request_body_and_status(api, looping, fake_openai):
    engine, _ = looping
    calls, _ = fake_openai
    status, body, stream = _openai(api, engine, b"GET", b"/v1/models", api.ffi.NULL)
    assert (status, json.loads(body), stream) == (200, {"data": [{"id": "smol"}]}, api.ffi.NULL)
    status, body, stream = _openai(api, engine, b"POST", b"/v1/completions", b"{}")
    assert (status, stream) == (400, api.ffi.NULL) and "bad" in body
    assert calls[0] == ("AsyncLLM", "GET", "/v1/models", "", "smol")


def test_openai_stream_chunks_then_end_of_stream(api, looping, fake_openai):
    engine, _ = looping
    lib, ffi = api.lib, api.ffi
    status, body, stream = _openai(api, engine, b"POST", b"/v1/completions",
                                   b'{"stream": true}')
    assert status == 200 and body is None and stream != ffi.NULL
    chunk, chunks = ffi.new("char **"), []
    while (st := lib.vllm_openai_stream_next(stream, 1000, chunk)) == lib.VLLM_OK:
        chunks.append(json.loads(ffi.string(chunk[0])))
        lib.vllm_string_free(chunk[0])
    assert st == lib.VLLM_END_OF_STREAM and chunks == [{"n": 1}, {"n": 2}]
    api.ok(lib.vllm_openai_stream_next(stream, 0, chunk), lib.VLLM_END_OF_STREAM)
    lib.vllm_openai_stream_free(stream)
    api.ok(lib.vllm_openai_stream_next(stream, 0, chunk), lib.VLLM_ERR_INVALID_HANDLE)


def test_openai_stream_timeout_cancel_and_free(api, looping, fake_openai):
    engine, _ = looping
    lib, ffi = api.lib, api.ffi
    _, made = fake_openai
    _, _, stream = _openai(api, engine, b"POST", b"/v1/chat/completions", b'{"stream": true}')
    made[-1].chunks = []  # nothing ready
    chunk = ffi.new("char **")
    api.ok(lib.vllm_openai_stream_next(stream, 10, chunk), lib.VLLM_ERR_TIMEOUT)
    api.ok(lib.vllm_openai_stream_cancel(stream))
    assert made[-1].cancelled
    api.ok(lib.vllm_openai_stream_next(stream, 10, chunk), lib.VLLM_END_OF_STREAM)
    lib.vllm_openai_stream_free(stream)
    _, _, stream = _openai(api, engine, b"POST", b"/v1/completions", b'{"stream": true}')
    lib.vllm_openai_stream_free(stream)  # unfinished: cancelled
    assert made[-1].cancelled


def test_openai_rejects_non_utf8_and_null_arguments(api, looping, fake_openai):
    engine, _ = looping
    lib, ffi = api.lib, api.ffi
    status, response, stream = ffi.new("int32_t *"), ffi.new("char **"), ffi.new(
        "vllm_openai_stream **")
    api.ok(lib.vllm_openai_request(engine, b"POST", b"/v1/completions", b"\xff", status,
                                   response, stream), lib.VLLM_ERR_INVALID_ARGUMENT)
    assert "UTF-8" in api.error()
    api.ok(lib.vllm_openai_request(engine, ffi.NULL, b"/v1/models", ffi.NULL, status,
                                   response, stream), lib.VLLM_ERR_INVALID_ARGUMENT)


def _completion(stream: bool, max_tokens: int = 12, **extra) -> bytes:
    body = {"model": "smol", "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": stream, **extra}
    return json.dumps(body).encode()


def test_real_openai_completion_equals_the_c_api_greedy_text(api, looping):
    engine, oracle = looping
    status, body, stream = _openai(api, engine, b"GET", b"/v1/models", api.ffi.NULL)
    assert status == 200 and [m["id"] for m in json.loads(body)["data"]] == ["smol"]
    status, body, stream = _openai(api, engine, b"POST", b"/v1/completions",
                                   _completion(False))
    assert status == 200 and stream == api.ffi.NULL, body
    response = json.loads(body)
    assert response["choices"][0]["text"] == oracle
    assert response["usage"]["completion_tokens"] == 12


def test_real_openai_streamed_completion_and_errors(api, looping):
    engine, oracle = looping
    lib, ffi = api.lib, api.ffi
    status, body, stream = _openai(api, engine, b"POST", b"/v1/completions", _completion(True))
    assert status == 200 and body is None
    chunk, text = ffi.new("char **"), ""
    while (st := lib.vllm_openai_stream_next(stream, 60000, chunk)) == lib.VLLM_OK:
        data = json.loads(ffi.string(chunk[0]))
        lib.vllm_string_free(chunk[0])
        text += "".join(c["text"] for c in data["choices"])
    assert st == lib.VLLM_END_OF_STREAM and text == oracle
    lib.vllm_openai_stream_free(stream)
    status, body, _ = _openai(api, engine, b"POST", b"/v1/completions",
                              _completion(False, max_tokens=-1))
    assert 400 <= status < 500 and "error" in json.loads(body)
    status, body, _ = _openai(api, engine, b"POST", b"/v1/completions", b"{not json")
    assert 400 <= status < 500 and "error" in json.loads(body)


def test_real_openai_stream_cancel_aborts_the_request(api, looping):
    engine, _ = looping
    lib, ffi = api.lib, api.ffi
    metrics = ffi.new("vllm_metrics *")
    metrics.struct_size = ffi.sizeof("vllm_metrics")
    api.ok(lib.vllm_engine_metrics(engine, metrics))
    aborted = metrics.request_success_abort
    _, _, stream = _openai(api, engine, b"POST", b"/v1/completions",
                           _completion(True, max_tokens=200))
    chunk = ffi.new("char **")
    api.ok(lib.vllm_openai_stream_next(stream, 60000, chunk))
    lib.vllm_string_free(chunk[0])
    api.ok(lib.vllm_openai_stream_cancel(stream))
    while (st := lib.vllm_openai_stream_next(stream, 60000, chunk)) == lib.VLLM_OK:
        lib.vllm_string_free(chunk[0])
    assert st == lib.VLLM_END_OF_STREAM
    lib.vllm_openai_stream_free(stream)
    deadline = time.monotonic() + 30
    while metrics.request_success_abort == aborted and time.monotonic() < deadline:
        time.sleep(0.05)
        api.ok(lib.vllm_engine_metrics(engine, metrics))
    assert metrics.request_success_abort == aborted + 1
    assert metrics.num_requests_running == 0
