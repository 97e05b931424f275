"""Shared by tests/test_responses_api.py and tests/test_anthropic_messages.py: examples/server
on the default model with the hermes tool parser, an API key, and the Responses store on
(VLLM_ENABLE_RESPONSES_API_STORE=1, capped at STORE_MAX_ENTRIES entries); raw SSE reading."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hostile_server import free_port, request

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "examples" / "server"
MODEL = "smol"
KEY = "agent-key-1"
STORE_MAX_ENTRIES = 4

# strict: the hermes parser's structural tags pin a call's arguments for strict tools only
WEATHER_PARAMETERS = {"type": "object", "properties": {"city": {"type": "string",
                                                                "maxLength": 20}},
                      "required": ["city"], "additionalProperties": False}


def start(built: Path, model_path: str, env: dict, log_path: Path):
    """(process, port) of a healthy server."""
    port = free_port()
    env = {**env, "VLLM_ENABLE_RESPONSES_API_STORE": "1",
           "VLLM_RESPONSES_API_STORE_MAX_ENTRIES": str(STORE_MAX_ENTRIES)}
    proc = subprocess.Popen(
        [sys.executable, str(SERVER / "server.py"), model_path, "--port", str(port),
         "--api-key", KEY, "--served-model-name", MODEL, "--max-model-len", "512",
         "--max-num-seqs", "8", "--tool-call-parser", "hermes", "--enable-auto-tool-choice",
         "--lib", str(built / "libvllm.so"), "--uvicorn-log-level", "warning"],
        stdout=log_path.open("w"), stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 300
    while request(port, "GET", "/health")[0] != 200:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"server did not become healthy:\n{log_path.read_text()}")
        time.sleep(0.3)
    return proc, port


def stop(proc) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def post(port: int, path: str, body, headers: dict) -> tuple[int, str]:
    status, _, text = request(port, "POST", path, body=json.dumps(body).encode(),
                              headers={"Content-Type": "application/json", **headers})
    return status, text


def sse_frames(port: int, path: str, body: dict, headers: dict) -> list[tuple[str | None, str]]:
    """(event name or None, data) of every SSE frame of a streamed answer."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", path, body=json.dumps(body).encode(),
                     headers={"Content-Type": "application/json", **headers})
        res = conn.getresponse()
        assert res.status == 200 and res.getheader("content-type").startswith(
            "text/event-stream")
        text = res.read().decode()
    finally:
        conn.close()
    frames = []
    for block in text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "data" in lines:
            frames.append((lines.get("event"), lines["data"]))
    return frames
