"""HTTP limits of the server: the request head size (431), strict framing (400) and the
body read (413, 408).

uvicorn has neither a head size status nor a body-read timeout: h11 refuses a head over
its buffer limit with a 400 and closes the socket with the client's bytes unread (so the
client sees a reset, not the status), and a body that stops arriving holds the
connection forever. HeadLimitH11Protocol answers 431 "Request Header Fields Too Large"
for a head of MAX_HEAD_BYTES or more and half-closes, reading what the client still
sends, so that the status arrives; read_body() caps the size and the wait for each
chunk. A request whose framing is not strict (framing.py: Content-Length with
Transfer-Encoding, a chunk size over 16 hex digits, a malformed chunk) gets a 400 and a
close at its turn among pipelined requests, never a wait for the body-read timeout.
A client that leaves mid-body is logged in one line, never as a traceback.
"""

from __future__ import annotations

import anyio
import h11
from framing import FramingCheck
from starlette.requests import ClientDisconnect, Request
from uvicorn.protocols.http.h11_impl import H11Protocol

MAX_HEAD_BYTES = 64 << 10  # request line + headers; as nginx's large_client_header_buffers
MAX_BODY_BYTES = 32 << 20
_LINGER_S = 1.0  # after a 431: how long the client's remaining bytes are read and dropped


class BodyError(Exception):
    """The body could not be read: (HTTP status, message) for the client."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def read_body(request: Request, timeout_s: float) -> bytearray:
    """The whole body (handed to libvllm without a copy); BodyError 413 past
    MAX_BODY_BYTES, 408 when no byte arrives for timeout_s, 400 when the client left."""
    body = bytearray()  # grown chunk by chunk: no long copy that would hold the GIL
    stream = request.stream()
    while True:
        try:
            with anyio.fail_after(timeout_s):
                chunk = await anext(stream)
        except StopAsyncIteration:
            return body
        except TimeoutError:
            raise BodyError(408, f"The request body did not arrive within {timeout_s:g} s.") \
                from None
        except ClientDisconnect:
            raise BodyError(400, "The client disconnected while sending the body.") from None
        if len(body) + len(chunk) > MAX_BODY_BYTES:
            raise BodyError(413, f"The request body is larger than {MAX_BODY_BYTES} bytes.")
        body += chunk


class HeadLimitH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a 431 for a request head of MAX_HEAD_BYTES or more
    (run with h11_max_incomplete_event_size above MAX_HEAD_BYTES, so that h11 does not
    refuse it first) and strict framing (framing.py): a request whose framing is not
    strict gets a 400 and a close once the requests pipelined before it are answered."""

    _refused = False  # a 431 or 400 was sent: the rest of the connection's bytes are dropped

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._framing = FramingCheck(MAX_HEAD_BYTES)
        self._framing_error: str | None = None  # the refusal due once h11 reaches it

    def data_received(self, data: bytes) -> None:
        if self._refused or self._framing_error is not None:
            return  # read and dropped: closing with unread bytes would reset the connection
        if self.conn.their_state is h11.IDLE and self._head_too_large(data):
            self.logger.warning("Request head of %d bytes or more refused (431).", MAX_HEAD_BYTES)
            self._refuse(431, "Request Header Fields Too Large", "Request Header Fields Too Large")
            return
        fed_before = self._framing.fed
        bad_at = self._framing.feed(data)
        if bad_at is not None:  # h11 gets the requests before the bad one, not that one
            self._framing_error = self._framing.error
            data = data[:max(0, bad_at - fed_before)]
            if data:
                super().data_received(data)
            self._refuse_framing_when_due()
            return
        super().data_received(data)

    def handle_events(self) -> None:
        super().handle_events()
        self._refuse_framing_when_due()

    def _refuse_framing_when_due(self) -> None:
        """The 400 for bad framing, once h11 has worked through the bytes before it and
        no response is under way (or the bad request's own body is being read)."""
        if self._framing_error is None or self._refused or self.transport.is_closing() or \
                self.conn.trailing_data[0]:
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            if self.conn.their_state is not h11.SEND_BODY:
                return  # an earlier pipelined request is still being answered
            cycle.disconnected = True  # its app reads no more body and sends nothing
            cycle.message_event.set()
        if self.conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            self._refused = True
            self.transport.close()  # a response is half sent: only a close is left
            return
        self.logger.warning("Request refused (400): %s.", self._framing_error)
        self._refuse(400, "Bad Request", f"Invalid HTTP request received: {self._framing_error}.")

    def _head_too_large(self, data: bytes) -> bool:
        buffered = self.conn.trailing_data[0] + data
        end = buffered.find(b"\r\n\r\n", 0, MAX_HEAD_BYTES + 4)
        return end + 4 > MAX_HEAD_BYTES if end != -1 else len(buffered) >= MAX_HEAD_BYTES

    def _refuse(self, status: int, reason: str, text: str) -> None:
        """Answers status with connection: close and half-closes, reading what the client
        still sends for a while, so that the status arrives before the close."""
        self._refused = True
        message = text.encode()
        self.transport.write(
            b"HTTP/1.1 %d %s\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close"
            b"\r\ncontent-length: %d\r\n\r\n%s" % (status, reason.encode(), len(message), message))
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(_LINGER_S, self.transport.close)
