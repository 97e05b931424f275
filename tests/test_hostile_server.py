"""Hostile input through examples/server on the default model: each
input of the issue, exactly, gets its 4xx with vLLM's error body {"error": {message, type,
param, code}}, never a traceback in the server log, and the next ordinary request is
served. Also: /health stays fast while a 32 MB prompt is refused, a non-streamed request
whose client leaves is aborted within 1 s, the body-read timeout (408) and the 431 for a
request head of 64 KB.

Statuses and messages as vLLM 0.33: vllm/entrypoints/openai/chat_completion/protocol.py
(tools), transformers' apply_chat_template (the empty conversation, which vLLM calls),
vllm/entrypoints/serve/exception_handling (the error body).
"""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from hostile_server import (
    ABORTED,
    BODY_READ_TIMEOUT_S,
    MAX_MODEL_LEN,
    MODEL,
    RUNNING,
    error_of,
    metrics,
    no_traceback,
    raw,
    request,
    served,
    server_fixture,
)

pytestmark = [pytest.mark.capi, pytest.mark.slow]


server = server_fixture("hostile", check_log=True)


def _post(port, path, body: bytes, content_type="application/json"):
    return request(port, "POST", path, body=body, headers={"Content-Type": content_type})


@pytest.mark.parametrize("body, content_type", [
    (b'{"prompt":"\xff\xfe abc","max_tokens":2}', "application/json"),  # the curl
    (b'{"prompt":"abc","max_tokens":2,"model":"\xc3"}', "application/json"),
    ('{"prompt":"abc","max_tokens":2}'.encode("utf-16"), "application/json"),
    ('{"prompt":"abc","max_tokens":2}'.encode("utf-32"), "application/json"),
    ('{"prompt":"caf\xe9","max_tokens":2}'.encode("latin-1"),
     "application/json; charset=latin-1"),
])
def test_1_body_not_utf8_is_400(server, body, content_type):
    port, log = server
    error = error_of(*_post(port, "/v1/completions", body, content_type)[::2], 400)
    assert error["type"] == "BadRequestError" and "UTF-8" in error["message"]
    served(port)
    no_traceback(log)


def test_2_tool_function_not_an_object_is_400(server):
    port, log = server
    body = (b'{"model":"smollm2","max_tokens":1,"tools":[{"type":"function","function":"abc"}],'
            b'"messages":[{"role":"user","content":"call f"}],"tool_choice":{"type":"function",'
            b'"function":{"name":"f"}}}')
    error = error_of(*_post(port, "/v1/chat/completions", body)[::2], 400)
    assert error["param"] == "tools.0.function" and "FunctionDefinition" in error["message"]
    served(port)
    no_traceback(log)


def test_3_huge_prompt_refused_without_stalling_health(server):
    """A maximal body (32 MB prompt) is refused with the context-length 400 while /health
    keeps answering (median within 50 ms, p99 within 1 s, each over the machine's own
    p99 when idle: other jobs may share it) and a small request is served meanwhile. The
    p99 allows one GIL hold of the front end's reading and parsing of the body (libvllm
    parses in the server's interpreter, as vLLM's API server parses on its event loop):
    120 to 280 ms on an idle 2-core machine, 565 ms once in CI with two test workers on
    its two cores (2026-12-02), against 10 s and more if the 16M-token prompt were
    tokenized under the GIL."""
    port, log = server
    prompt = "a " * 16_000_000
    body = json.dumps({"prompt": prompt, "max_tokens": 2}).encode()
    assert len(body) < 32 << 20
    result = {}

    def big():
        result["big"] = _post(port, "/v1/completions", body)

    def small():
        result["small"] = _post(port, "/v1/completions", json.dumps(
            {"prompt": "Hi", "max_tokens": 2}).encode())

    thread, other = threading.Thread(target=big), threading.Thread(target=small)
    idle = _health_p99(port, lambda n: n < 50)  # the machine's own noise (it may be shared)
    latencies = []
    thread.start()
    other.start()
    p99 = _health_p99(port, lambda n: thread.is_alive(), latencies)
    thread.join()
    other.join(timeout=30)
    assert result["small"][0] == 200, result["small"]
    error = error_of(*result["big"][::2], 400)
    assert f"maximum context length is {MAX_MODEL_LEN} tokens" in error["message"]
    assert error["param"] == "input_tokens"
    median = latencies[len(latencies) // 2] if latencies else 0  # sorted by _health_p99
    assert len(latencies) >= 5 and median < 0.05 + idle and p99 < 1.0 + idle, (
        idle, len(latencies), median, latencies[-5:])
    served(port)
    no_traceback(log)


def _health_p99(port, go_on, latencies=None) -> float:
    """p99 of /health latencies (seconds), probed every 10 ms while go_on(n_probes)."""
    latencies = [] if latencies is None else latencies
    while go_on(len(latencies)):
        started = time.perf_counter()
        assert request(port, "GET", "/health")[0] == 200
        latencies.append(time.perf_counter() - started)
        time.sleep(0.01)
    latencies.sort()
    return latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] if latencies else 0


def test_4_non_streamed_client_disconnect_aborts_within_1s(server):
    """Aborted within 1 s of the disconnect, plus one engine step: an abort lands between
    steps (as in vLLM), and a step is slow when the machine is shared (measured here as
    the time of a 2-token request; ~0.1 s on an idle 2-core machine)."""
    port, log = server
    started = time.monotonic()
    served(port)
    step_allowance = time.monotonic() - started
    before = metrics(port)[ABORTED]
    body = json.dumps({"model": MODEL, "prompt": "Tell me a long story.", "max_tokens": 200,
                       "temperature": 0, "ignore_eos": True}).encode()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                 b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    deadline = time.monotonic() + 30
    while metrics(port)[RUNNING] < 1:
        assert time.monotonic() < deadline, "the request never ran"
        time.sleep(0.05)
    sock.close()
    left = time.monotonic()
    while True:
        now = metrics(port)
        if now[ABORTED] == before + 1 and now[RUNNING] == 0:
            break
        assert time.monotonic() - left < 1.0 + step_allowance, f"not aborted in 1 s: {now}"
        time.sleep(0.05)
    served(port)
    assert metrics(port)[ABORTED] == before + 1  # a finished response is not counted
    no_traceback(log)


def test_5_body_that_never_arrives_gets_408(server):
    """Content-Length and chunked together, a chunk size that promises 2**72 bytes."""
    port, log = server
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 10\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"ffffffffffffffffff\r\n{\"prompt\":")
    started = time.monotonic()
    answer = raw(port, head, timeout=BODY_READ_TIMEOUT_S + 10)
    status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0
    assert status in (400, 408), answer
    assert time.monotonic() - started < BODY_READ_TIMEOUT_S + 5
    if status == 408:
        error_of(408, answer.split(b"\r\n\r\n", 1)[1].decode(), 408)
    served(port)
    no_traceback(log)


def test_5_client_that_gives_up_mid_body_logs_no_traceback(server):
    port, log = server
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n{\"prompt\":")
    raw(port, head, timeout=0.5, then=lambda sock: (time.sleep(0.2),
                                                   sock.shutdown(socket.SHUT_RDWR)))
    time.sleep(0.5)
    served(port)
    no_traceback(log)


@pytest.mark.parametrize("size", [64 << 10, 256 << 10])
def test_5_huge_headers_get_431(server, size):
    port, log = server
    head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * size + b"\r\n\r\n"
    answer = raw(port, head, timeout=10)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    status, _, _ = request(port, "GET", "/health", headers={"X-Fine": "a" * (32 << 10)})
    assert status == 200  # below the limit: served
    served(port)
    no_traceback(log)


def test_6_nul_byte_does_not_truncate_the_body(server):
    port, log = server
    error = error_of(*_post(port, "/v1/completions",
                            b'{"prompt":"a","max_tokens":1}\x00 junk')[::2], 400)
    assert "json_invalid" in error["message"]
    served(port)
    no_traceback(log)


def test_8_empty_messages_is_400(server):
    port, log = server
    error = error_of(*_post(port, "/v1/chat/completions",
                            b'{"model":"smollm2","messages":[],"max_tokens":8}')[::2], 400)
    assert error == {"message": "Cannot apply chat template to an empty conversation. Provide "
                     "at least one message.", "type": "BadRequestError", "param": None,
                     "code": 400}
    served(port)
    no_traceback(log)
