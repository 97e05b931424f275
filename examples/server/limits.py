"""HTTP limits of the server: the request head size (431) and the body read (413, 408).

uvicorn has neither a head size status nor a body-read timeout: h11 refuses a head over
its buffer limit with a 400 and closes the socket with the client's bytes unread (so the
client sees a reset, not the status), and a body that stops arriving holds the
connection forever. HeadLimitH11Protocol answers 431 "Request Header Fields Too Large"
for a head of MAX_HEAD_BYTES or more and half-closes, reading what the client still
sends, so that the status arrives; read_body() caps the size and the wait for each
chunk. A client that leaves mid-body is logged in one line, never as a traceback.
"""

from __future__ import annotations

import anyio
import h11
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
    refuse it first)."""

    _refused = False  # a 431 was sent: the rest of the connection's bytes are dropped

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # read and dropped: closing with unread bytes would reset the connection
        if self.conn.their_state is h11.IDLE and self._head_too_large(data):
            self._refuse_head()
            return
        super().data_received(data)

    def _head_too_large(self, data: bytes) -> bool:
        buffered = self.conn.trailing_data[0] + data
        end = buffered.find(b"\r\n\r\n", 0, MAX_HEAD_BYTES + 4)
        return end + 4 > MAX_HEAD_BYTES if end != -1 else len(buffered) >= MAX_HEAD_BYTES

    def _refuse_head(self) -> None:
        self._refused = True
        self.logger.warning("Request head of %d bytes or more refused (431).", MAX_HEAD_BYTES)
        message = b"Request Header Fields Too Large"
        self.transport.write(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; "
            b"charset=utf-8\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s"
            % (len(message), message))
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(_LINGER_S, self.transport.close)
