"""examples/server liveness: no client waits on another client's work; strict HTTP framing;
flat memory.

Liveness checks with wide margins, not benchmarks (examples/bench/probe_latency.py gives
the latencies): while 8 streamed chats and one long prefill run, /health, /v1/models,
/metrics, /tokenize and validation errors (max_tokens=-1 -> 400, an unknown model -> 404)
each answer within 1 s, as vLLM's API server answers them without the engine
(vllm/entrypoints/serve/instrumentator/health.py, openai/models/serving.py). Raw HTTP as
RFC 9112 6.1 and 7.1: Content-Length with Transfer-Encoding, a chunk size of 18 hex digits
and a malformed chunk each get a 400 and a close within 1 s; pipelined requests are
answered in order. The idle server's RSS after a hostile burst stays within 1.5x of its
RSS after the first request. One server for the module (the xdist scheduler keeps a module
on one worker).
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time

import pytest
from hostile_server import (
    JSON,
    MODEL,
    no_traceback,
    request,
    rss_mb,
    served,
    start_server,
    stop_server,
)

pytestmark = [pytest.mark.capi, pytest.mark.slow]

MAX_MODEL_LEN = 2560
PROBE_LIMIT_S = 1.0
_CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a story."}]}


@pytest.fixture(scope="module")
def server(built, model_path, child_env, tmp_path_factory):
    proc, port, log = start_server(built, model_path, child_env,
                                   tmp_path_factory.mktemp("liveness") / "server.log",
                                   max_model_len=MAX_MODEL_LEN)
    request(port, "POST", "/v1/chat/completions", headers=JSON,
            body=json.dumps({**_CHAT, "max_tokens": 2}))
    yield proc, port, log, rss_mb(proc.pid)
    stop_server(proc)
    no_traceback(log)


def _stream_chat(port: int, started: threading.Event, chunks: list) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    conn.request("POST", "/v1/chat/completions", headers=JSON, body=json.dumps(
        {**_CHAT, "max_tokens": 200, "ignore_eos": True, "stream": True}))
    res = conn.getresponse()
    while line := res.readline():
        if line.startswith(b"data: {"):
            chunks.append(line)
            started.set()
    conn.close()


def _long_prefill(port: int, done: list) -> None:
    prompt = " ".join(["word"] * 2000)  # 2,000 tokens
    done.append(request(port, "POST", "/v1/completions", headers=JSON, body=json.dumps(
        {"model": MODEL, "prompt": prompt, "max_tokens": 2}), timeout=600)[0])


def _timed(port: int, method: str, path: str, body: dict | None = None) -> tuple[int, float]:
    started = time.monotonic()
    status, _, _ = request(port, method, path, headers=JSON,
                           body=None if body is None else json.dumps(body))
    return status, time.monotonic() - started


def test_probes_answer_while_chat_streams_and_a_long_prefill_run(server):
    _, port, _, _ = server
    started, chunks, prefill = threading.Event(), [], []
    workers = [threading.Thread(target=_stream_chat, args=(port, started, chunks))
               for _ in range(8)] + [threading.Thread(target=_long_prefill, args=(port, prefill))]
    for worker in workers:
        worker.start()
    assert started.wait(120), "no stream started"
    probes = [("GET", "/health", None, 200), ("GET", "/v1/models", None, 200),
              ("GET", "/metrics", None, 200),
              ("POST", "/tokenize", {"model": MODEL, "prompt": "hi"}, 200),
              ("POST", "/v1/chat/completions", {**_CHAT, "max_tokens": -1}, 400),
              ("POST", "/v1/chat/completions", {**_CHAT, "model": "nope"}, 404),
              ("POST", "/v1/chat/completions", {**_CHAT, "messages": []}, 400)]
    slow = []
    for _ in range(3):
        for method, path, body, want in probes:
            status, took = _timed(port, method, path, body)
            assert status == want, (path, status)
            if took >= PROBE_LIMIT_S:
                slow.append((path, round(took, 2)))
    streaming = any(w.is_alive() for w in workers[:8])
    for worker in workers:
        worker.join(300)
    assert streaming, "the load ended before the probes: the check proved nothing"
    assert not slow, f"probes waited on other clients' work: {slow}"
    assert prefill == [200] and len(chunks) >= 8


def _raw_exchange(port: int, data: bytes) -> tuple[bytes, float, bool]:
    """(what the server sent, seconds until it closed, whether it closed within 5 s)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        started, answer = time.monotonic(), b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except TimeoutError:
            return answer, time.monotonic() - started, False
        return answer, time.monotonic() - started, True


_HEAD = b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
_BODY = json.dumps({"model": MODEL, "prompt": "hi"}).encode()


@pytest.mark.parametrize("framing", [
    b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n"
    % (len(_BODY), _BODY),
    b"Transfer-Encoding: chunked\r\n\r\n%018x\r\n%s\r\n0\r\n\r\n" % (len(_BODY), _BODY),
    b"Transfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\n%s" % _BODY,
    b"Transfer-Encoding: chunked\r\n\r\nzz\r\n%s\r\n0\r\n\r\n" % _BODY,
    b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%sXY0\r\n\r\n" % (len(_BODY), _BODY),
], ids=["content-length-and-chunked", "18-hex-digits", "18-hex-digits-huge",
        "bad-chunk-size", "no-crlf-after-chunk"])
def test_bad_framing_gets_400_and_close_within_1s(server, framing):
    _, port, _, _ = server
    answer, took, closed = _raw_exchange(port, _HEAD + framing)
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    assert closed and took < PROBE_LIMIT_S, took
    served(port)


def test_pipelined_posts_get_their_answers_in_order(server):
    _, port, _, _ = server
    bodies = [json.dumps({"model": MODEL, "prompt": p}).encode() for p in ("a", "hi", "a b c")]
    data = b"".join(_HEAD + b"Content-Length: %d\r\n\r\n%s" % (len(b), b) for b in bodies)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(data)
        reader = sock.makefile("rb")
        counts = []
        for _ in bodies:
            status = reader.readline()
            assert status.startswith(b"HTTP/1.1 200 "), status
            headers = dict(line.rstrip(b"\r\n").split(b": ", 1)
                           for line in iter(reader.readline, b"\r\n"))
            counts.append(json.loads(reader.read(int(headers[b"content-length"])))["count"])
    assert counts == [1, 1, 3]


def test_pipelined_good_then_bad_framing_answers_the_good_one_first(server):
    _, port, _, _ = server
    good = _HEAD + b"Content-Length: %d\r\n\r\n%s" % (len(_BODY), _BODY)
    bad = _HEAD + b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    answer, took, closed = _raw_exchange(port, good + bad)
    first, _, rest = answer.partition(b"HTTP/1.1 400 ")
    assert first.startswith(b"HTTP/1.1 200 ") and rest, answer[:400]
    assert closed and took < PROBE_LIMIT_S


def _hostile_burst(port: int) -> None:
    """Smaller than the benchmark's battery: big and deep bodies, grammars, bad fields."""
    big = json.dumps({"model": MODEL, "prompt": "x " * (4 << 20)}).encode()
    for _ in range(3):
        request(port, "POST", "/v1/completions", headers=JSON, body=big)
        request(port, "POST", "/v1/completions", headers=JSON, body="[" * 50000 + "]" * 50000)
    for i in range(3):
        schema = {"type": "object", "properties": {f"p{j}": {
            "type": "string", "pattern": f"[a-z]{{{j},{j + i + 3}}}"} for j in range(20)}}
        request(port, "POST", "/v1/chat/completions", headers=JSON, body=json.dumps(
            {**_CHAT, "max_tokens": 2, "response_format": {
                "type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}))
        request(port, "POST", "/v1/chat/completions", headers=JSON, body=json.dumps(
            {**_CHAT, "max_tokens": 2, "structured_outputs": {"regex": "(a|aa)*" * 20 + "b"}}))
    for n in range(20):
        request(port, "POST", "/v1/chat/completions", headers=JSON, body=json.dumps(
            {**_CHAT, "max_tokens": -1, "temperature": "hot", "n": n}))


def test_idle_rss_after_a_hostile_burst_stays_near_the_first_requests(server):
    proc, port, _, first_rss = server
    for _ in range(2):
        _hostile_burst(port)
    served(port)
    time.sleep(3)  # idle: the server gives freed memory back
    assert rss_mb(proc.pid) < 1.5 * first_rss, (rss_mb(proc.pid), first_rss)
