"""examples/server/framing.py: the strict request framing checked in front of h11
(RFC 9112 6.1: Content-Length with Transfer-Encoding is refused; 7.1: chunk-size lines,
chunk data followed by CRLF, trailers). Fed whole or byte by byte, strict requests
(pipelined, chunked with extensions and trailers) pass, and the offset reported for a bad
one is where that request starts, so the requests before it are still answered.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples" / "server"))
from framing import FramingCheck  # noqa: E402

HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
BODY = b'{"prompt": "hi"}'
BY_LENGTH = HEAD + b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
CHUNKED = HEAD + b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)
WITH_TRAILERS = HEAD + b"Transfer-Encoding: chunked\r\n\r\n3;name=v\r\nabc\r\n0\r\nX-T: 1\r\n\r\n"
GET = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"


def _feed(data: bytes, bytewise: bool) -> tuple[int | None, str | None]:
    check = FramingCheck(max_head_bytes=64 << 10)
    for piece in ([data[i:i + 1] for i in range(len(data))] if bytewise else [data]):
        if (bad := check.feed(piece)) is not None:
            return bad, check.error
    return None, None


@pytest.mark.parametrize("bytewise", [False, True])
def test_strict_pipelined_requests_pass(bytewise):
    assert _feed(BY_LENGTH + CHUNKED + WITH_TRAILERS + GET + BY_LENGTH, bytewise) == (None, None)


@pytest.mark.parametrize("bytewise", [False, True])
@pytest.mark.parametrize(("bad", "why"), [
    (HEAD + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", "Content-Length"),
    (HEAD + b"Transfer-Encoding: chunked\r\n\r\n%018x\r\nhello\r\n0\r\n\r\n" % 5, "16 hex"),
    (HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n", "chunk-size"),
    (HEAD + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhelloXY", "CRLF"),
    (HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + b"1" * 5000, "too long"),
])
def test_bad_framing_is_reported_at_its_request(bad, why, bytewise):
    offset, error = _feed(BY_LENGTH + GET + bad, bytewise)
    assert offset == len(BY_LENGTH + GET) and why in error


def test_sixteen_hex_digits_are_allowed():
    data = HEAD + b"Transfer-Encoding: chunked\r\n\r\n%016x\r\nhello\r\n0\r\n\r\n" % 5
    assert _feed(data, False) == (None, None)


def test_framing_h11_refuses_by_itself_is_left_to_it():
    unknown_coding = HEAD + b"Transfer-Encoding: gzip\r\n\r\nzz\r\n"
    assert _feed(unknown_coding, False) == (None, None)
