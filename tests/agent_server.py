"""Shared by tests/test_responses_api.py and tests/test_anthropic_messages.py: examples/server
on the default model with the hermes tool parser, an API key, and the Responses store on
(VLLM_ENABLE_RESPONSES_API_STORE=1, capped at STORE_MAX_ENTRIES entries); raw SSE reading."""

from __future__ import annotations

import http.client
import json
from pathlib import Path

import pytest
from hostile_server import launch, request
from hostile_server import stop_server as stop

MODEL = "smol"
KEY = "agent-key-1"
STORE_MAX_ENTRIES = 4
LOGS: dict[int, Path] = {}  # a started server's port -> its log

# strict: the hermes parser's structural tags pin a call's arguments for strict tools only
WEATHER_PARAMETERS = {"type": "object", "properties": {"city": {"type": "string",
                                                                "maxLength": 20}},
                      "required": ["city"], "additionalProperties": False}


def start(built: Path, model_path: str, env: dict, log_path: Path):
    """(process, port) of a healthy server."""
    env = {**env, "VLLM_ENABLE_RESPONSES_API_STORE": "1",
           "VLLM_RESPONSES_API_STORE_MAX_ENTRIES": str(STORE_MAX_ENTRIES)}
    return launch(built, model_path, env, log_path, (
        "--api-key", KEY, "--served-model-name", MODEL, "--max-model-len", "512",
        "--max-num-seqs", "8", "--tool-call-parser", "hermes", "--enable-auto-tool-choice"))


def server_fixture(label: str):
    """A module-scoped `server` fixture: the port of a healthy server (its log, under a
    folder named label, in LOGS[port]), stopped after the module."""
    @pytest.fixture(scope="module")
    def server(built, model_path, child_env, tmp_path_factory):
        log_path = tmp_path_factory.mktemp(label) / "server.log"
        proc, port = start(built, model_path, child_env, log_path)
        LOGS[port] = log_path
        yield port
        stop(proc)
    return server


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
