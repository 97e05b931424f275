"""The requests examples/bench/soak.py sends: one function per kind, each returning the HTTP
status (0: no answer, -1: the client cut the stream on purpose).

Kinds: a streamed chat it may cut mid-stream, a short completion, a malformed request
(broken JSON, max_tokens=-1, Content-Length with Transfer-Encoding, an 18-hex-digit chunk
size), a structured-output request, and a hostile one (a 32 MB body, 10,000-deep JSON, a
pathological regex, fields of the wrong type), as the hostile battery of the server's
tests sends them.
"""

from __future__ import annotations

import json
import random
import socket

from probe_latency import call

MODEL = "soak"
HEADERS = {"Content-Type": "application/json"}
KINDS = ("stream", "complete", "malformed", "structured", "hostile")
DEFAULT_MIX = "stream,stream,complete,malformed,structured"
_INVALID = b'{"model": "soak", "max_tokens": -1, "prompt": "hi", "n": "two"}'
_MB = 1 << 20


def _raw(port: int, head: bytes, body: bytes, timeout: float) -> int:
    """Sends one POST /v1/completions with these extra head lines and body; its status."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                      b"application/json\r\n" + head + b"\r\n")
            if body:
                s.sendall(body)
            return int(s.makefile("rb").readline().split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def stream(url: str, port: int, rng: random.Random) -> int:
    body = json.dumps({"model": MODEL, "stream": True, "max_tokens": rng.randint(8, 96),
                       "messages": [{"role": "user", "content": "Tell me a story."}]})
    cut_after = rng.choice([None, None, 1, 3])
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=120) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                      b"application/json\r\nContent-Length: %d\r\n\r\n%s"
                      % (len(body), body.encode()))
            reader = s.makefile("rb")
            status = int(reader.readline().split()[1])
            events = 0
            while line := reader.readline():
                events += line.startswith(b"data:")
                if cut_after is not None and events >= cut_after:
                    return -1  # the client leaves mid-stream
            return status
    except (OSError, IndexError, ValueError):
        return 0


def complete(url: str, port: int, rng: random.Random) -> int:
    return call(url, "POST", "/v1/completions", {
        "model": MODEL, "prompt": "Hello " * rng.randint(1, 300),
        "max_tokens": rng.randint(1, 16)}, HEADERS, timeout=120)


def structured(url: str, port: int, rng: random.Random) -> int:
    schema = {"type": "object", "properties": {
        f"k{i}": {"type": "string", "maxLength": rng.randint(2, 9)} for i in range(4)}}
    return call(url, "POST", "/v1/chat/completions", {
        "model": MODEL, "max_tokens": 12, "messages": [{"role": "user", "content": "x"}],
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "s", "schema": schema}}},
        HEADERS, timeout=120)


def malformed(url: str, port: int, rng: random.Random) -> int:
    head, body = rng.choice([
        (b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", b"0\r\n\r\n"),
        (b"Transfer-Encoding: chunked\r\n", b"ffffffffffffffffff\r\nab"),
        (b"Content-Length: 9\r\n", b'{"model":'),
        (b"Content-Length: %d\r\n" % len(_INVALID), _INVALID)])
    return _raw(port, head, body, timeout=30)


def hostile(url: str, port: int, rng: random.Random) -> int:
    choice = rng.randrange(5)
    if choice == 0:  # a 32 MB prompt (the body limit): 413 or 400, never kept
        body = b'{"model": "soak", "max_tokens": 1, "prompt": "' + b"a" * (32 * _MB) + b'"}'
        return _raw(port, b"Content-Length: %d\r\n" % len(body), body, timeout=60)
    if choice == 1:  # 10,000-deep JSON
        body = b'{"model": "soak", "prompt": "hi", "x": ' + b"[" * 10_000 + b"]" * 10_000 + b"}"
        return _raw(port, b"Content-Length: %d\r\n" % len(body), body, timeout=30)
    messages = [{"role": "user", "content": "x"}]
    if choice == 2:  # a pathological regex constraint
        extra = {"structured_outputs": {"regex": "(a|aa)*" * rng.randint(5, 20) + "b"}}
    elif choice == 3:  # a grammar to compile, different each time
        extra = {"structured_outputs": {"grammar": f'root ::= "{rng.random()}" [a-z]*'}}
    else:  # fields of the wrong type
        extra = {rng.choice(["temperature", "n", "stop", "top_p", "logit_bias", "seed"]):
                 rng.choice(["hot", [1], {"a": None}, -7, 1e308])}
    return call(url, "POST", "/v1/chat/completions", {
        "model": MODEL, "max_tokens": 4, "messages": messages, **extra}, HEADERS, timeout=120)
