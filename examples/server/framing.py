"""Strict HTTP/1.1 request framing (RFC 9112 sections 6 and 7.1), checked on the raw bytes.

h11, under uvicorn, accepts a request with both Content-Length and Transfer-Encoding
(RFC 9112 6.1: the server may reject it, and must close the connection either way) and
chunk sizes of up to 20 hex digits, so a declared 2^72-byte chunk holds the connection
until the body-read timeout. FramingCheck follows the request stream byte by byte (heads,
Content-Length bodies, chunk-size lines, chunk data and its CRLF, trailers) and reports
the first request whose framing is not strict: limits.py answers it 400 and closes, after
the answers to the requests pipelined before it. It only frames; h11 still parses.
"""

from __future__ import annotations

import re

MAX_CHUNK_SIZE_DIGITS = 16  # a 64-bit size, as llhttp (Node) and nginx allow
_CHUNK_LINE = re.compile(rb"([0-9A-Fa-f]{1,%d})[ \t]*(?:;[^\r\n]*)?" % MAX_CHUNK_SIZE_DIGITS)
_MAX_LINE = 4096  # a chunk-size line with its extensions, or one trailer line
_MAX_TRAILERS = 64 << 10

_HEAD, _BODY, _CHUNK_LINE_STATE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _OFF = range(7)


class FramingCheck:
    """feed() the connection's bytes in order; it returns None while the framing is
    strict, else the stream offset where the offending request starts (`error` says
    why). A request h11 refuses by itself (a head it cannot parse, an unknown transfer
    coding) turns the check off: h11 answers it."""

    def __init__(self, max_head_bytes: int) -> None:
        self.max_head_bytes = max_head_bytes
        self.error: str | None = None
        self._state = _HEAD
        self._pos = 0  # stream offset of the next byte fed
        self._start = 0  # stream offset of the current request's head
        self._buf = bytearray()  # a head, a chunk-size line or trailers being read
        self._left = 0  # bytes of body or chunk data (or of the chunk's CRLF) still due

    def feed(self, data: bytes) -> int | None:
        i = 0
        while i < len(data) and self._state != _OFF and self.error is None:
            i = self._step(data, i)
        self._pos += len(data)
        return self._start if self.error is not None else None

    @property
    def fed(self) -> int:
        """Bytes fed so far."""
        return self._pos

    def _fail(self, message: str) -> int:
        self.error = message
        return 1 << 62

    def _step(self, data: bytes, i: int) -> int:
        state = self._state
        if state in (_BODY, _CHUNK_DATA):
            take = min(self._left, len(data) - i)
            self._left -= take
            if not self._left:
                self._state = _CHUNK_END if state == _CHUNK_DATA else self._next_request(i + take)
                self._buf.clear()
            return i + take
        if state == _CHUNK_END:  # the CRLF after chunk data
            piece = data[i:i + 2 - len(self._buf)]
            self._buf += piece
            if not b"\r\n".startswith(bytes(self._buf)):
                return self._fail("chunk data not followed by CRLF")
            if len(self._buf) == 2:
                self._buf.clear()
                self._state = _CHUNK_LINE_STATE
            return i + len(piece)
        end_marker = b"\r\n\r\n" if state in (_HEAD, _TRAILER) else b"\r\n"
        keep = len(self._buf)
        self._buf += data[i:]
        if state == _TRAILER and self._buf.startswith(b"\r\n"):
            end, end_marker = 0, b"\r\n"  # no trailers: the empty line alone
        else:
            end = self._buf.find(end_marker, max(0, keep - len(end_marker) + 1))
        if end == -1:
            limit = {_HEAD: self.max_head_bytes, _TRAILER: _MAX_TRAILERS}.get(state, _MAX_LINE)
            if len(self._buf) > limit:
                if state == _HEAD:
                    self._state = _OFF  # the 431 check answers it
                    return len(data)
                return self._fail("chunk-size line or trailers too long")
            return len(data)
        consumed = end + len(end_marker) - keep  # bytes of data[i:] up to the marker
        element, self._buf = bytes(self._buf[:end]), bytearray()
        after = i + consumed
        if state == _HEAD:
            return self._head(element, after)
        if state == _TRAILER:
            self._state = self._next_request(after)
            return after
        return self._chunk_line(element, after)

    def _next_request(self, offset_in_data: int) -> int:
        self._start = self._pos + offset_in_data
        return _HEAD

    def _head(self, head: bytes, after: int) -> int:
        lines = head.lstrip(b"\r\n").split(b"\r\n")
        lengths, codings = [], []
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                lengths.append(value.strip())
            elif name == b"transfer-encoding":
                codings.append(value.strip().lower())
        if lengths and codings:
            return self._fail("both Content-Length and Transfer-Encoding (RFC 9112 6.1)")
        if codings:
            if b",".join(codings).split(b",")[-1].strip() != b"chunked":
                self._state = _OFF  # h11 refuses it
                return after
            self._state = _CHUNK_LINE_STATE
            return after
        if not lengths:
            self._state = self._next_request(after)
            return after
        if len(set(lengths)) != 1 or not lengths[0].isdigit():
            self._state = _OFF  # h11 refuses it
            return after
        self._left = int(lengths[0])
        self._state = _BODY if self._left else self._next_request(after)
        return after

    def _chunk_line(self, line: bytes, after: int) -> int:
        match = _CHUNK_LINE.fullmatch(line)
        if match is None:
            return self._fail(f"invalid chunk-size line (at most {MAX_CHUNK_SIZE_DIGITS} hex "
                              "digits, then optional extensions)")
        self._left = int(match[1], 16)
        self._state = _CHUNK_DATA if self._left else _TRAILER
        return after
