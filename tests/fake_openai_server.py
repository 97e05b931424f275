"""A stand-in for examples/server in the bench scripts' tests: a threaded HTTP server on a
free port that answers the routes examples/bench/soak.py and probe_latency.py send, in
their shapes (JSON, SSE streams ending with [DONE], 400 for max_tokens=-1 or bad JSON),
without a model. It counts the requests it answered per path."""

from __future__ import annotations

import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
        self.server.answered[self.path] += 1

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self._send(200 if self.path in ("/health", "/v1/models", "/metrics") else 404, {})

    def do_POST(self) -> None:  # noqa: N802
        if "Transfer-Encoding" in self.headers:
            self._send(400, {"error": "framing"})
            return
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        except (ValueError, RecursionError):
            self._send(400, {"error": "invalid JSON"})
            return
        if not isinstance(body.get("max_tokens", 1), int) or body.get("max_tokens", 1) < 0:
            self._send(400, {"error": "max_tokens"})
            return
        if not body.get("stream"):
            self._send(200, {"choices": [{"text": "ok"}]})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        try:
            for _ in range(5):
                self.wfile.write(b'data: {"choices": [{"delta": {"content": "a"}}]}\n\n')
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
        except OSError:
            return  # the client cut the stream
        self.server.answered[self.path] += 1


class FakeServer:
    def __enter__(self) -> FakeServer:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.answered = Counter()
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    @property
    def answered(self) -> Counter:
        return self.httpd.answered

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
