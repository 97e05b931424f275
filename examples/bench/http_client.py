"""A minimal asyncio HTTP/1.1 client for the serving benchmark: JSON GET/POST and SSE.

vLLM's bench client uses aiohttp (vllm/benchmarks/lib/endpoint_request_func.py); aiohttp
is not installed here or on the GPU machine, so this speaks HTTP/1.1 over asyncio streams
itself: one connection per request (Connection: close), Content-Length or chunked bodies,
SSE `data:` events split on blank lines (vLLM's StreamedResponseHandler). Plain http only.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from urllib.parse import urlsplit


class HTTPError(Exception):
    def __init__(self, status: int, reason: str, body: bytes) -> None:
        super().__init__(f"HTTP {status} {reason}: {body[:500].decode(errors='replace')}")
        self.status, self.reason, self.body = status, reason, body


async def _open(url: str, method: str, body: bytes | None, headers: dict[str, str]
                ) -> tuple[int, str, dict[str, str], asyncio.StreamReader,
                           asyncio.StreamWriter]:
    parts = urlsplit(url)
    if parts.scheme != "http":
        raise ValueError(f"only http:// URLs are supported, got {url!r}")
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port or 80,
                                                   limit=1 << 24)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    head = {"Host": parts.netloc, "Connection": "close", "Accept": "*/*", **headers}
    if body is not None:
        head["Content-Length"] = str(len(body))
    lines = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in head.items()), "", ""]
    writer.write("\r\n".join(lines).encode() + (body or b""))
    await writer.drain()
    status_line = (await reader.readline()).decode("latin-1").rstrip("\r\n")
    version, _, rest = status_line.partition(" ")
    if not version.startswith("HTTP/"):
        writer.close()
        raise ConnectionError(f"bad status line {status_line!r}")
    code, _, reason = rest.partition(" ")
    resp_headers: dict[str, str] = {}
    while (line := (await reader.readline()).decode("latin-1").rstrip("\r\n")):
        key, _, value = line.partition(":")
        resp_headers[key.strip().lower()] = value.strip()
    return int(code), reason, resp_headers, reader, writer


async def _body_chunks(reader: asyncio.StreamReader, headers: dict[str, str]
                       ) -> AsyncIterator[bytes]:
    """The response body as it arrives, de-chunked."""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                await reader.readline()
                return
            yield await reader.readexactly(size)
            await reader.readexactly(2)
    elif "content-length" in headers:
        yield await reader.readexactly(int(headers["content-length"]))
    else:
        while chunk := await reader.read(1 << 16):
            yield chunk


async def request_json(url: str, payload: dict | None = None,
                       headers: dict[str, str] | None = None) -> dict:
    """GET (payload None) or POST a JSON body; the decoded JSON response."""
    body = None if payload is None else json.dumps(payload).encode()
    hdrs = dict(headers or {})
    if body is not None:
        hdrs["Content-Type"] = "application/json"
    status, reason, resp_headers, reader, writer = await _open(
        url, "GET" if body is None else "POST", body, hdrs)
    try:
        data = b"".join([c async for c in _body_chunks(reader, resp_headers)])
    finally:
        writer.close()
    if status != 200:
        raise HTTPError(status, reason, data)
    return json.loads(data)


async def stream_sse(url: str, payload: dict, headers: dict[str, str] | None = None
                     ) -> AsyncIterator[str]:
    """POST a JSON body; yield each SSE event's data (after `data:`, stripped) as it
    arrives. Comment events (`:` first) are skipped. Raises HTTPError on a non-200."""
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    status, reason, resp_headers, reader, writer = await _open(
        url, "POST", json.dumps(payload).encode(), hdrs)
    try:
        if status != 200:
            raise HTTPError(status, reason,
                            b"".join([c async for c in _body_chunks(reader, resp_headers)]))
        buffer = b""
        async for chunk in _body_chunks(reader, resp_headers):
            buffer += chunk.replace(b"\r\n", b"\n")
            *events, buffer = buffer.split(b"\n\n")
            for event in events:
                message = event.decode().strip()
                if message and not message.startswith(":"):
                    yield message.removeprefix("data:").strip()
        if buffer.strip():
            yield buffer.decode().strip().removeprefix("data:").strip()
    finally:
        writer.close()
