"""Shared by tests/test_hostile_*.py: examples/server on the default model, raw HTTP helpers,
the OpenAI error-body check, the server log's traceback check and the RSS of a process."""

from __future__ import annotations

import http.client
import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "examples" / "server"
MODEL = "smollm2"
MAX_MODEL_LEN = 512
BODY_READ_TIMEOUT_S = 2
LABELS = f'{{engine="0",model_name="{MODEL}"}}'
ABORTED = f'vllm:request_success_total{{engine="0",model_name="{MODEL}",finished_reason="abort"}}'
RUNNING = f"vllm:num_requests_running{LABELS}"
JSON = {"Content-Type": "application/json"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(built: Path, model_path: str, env: dict, log_path: Path, flags: tuple[str, ...],
           ready_path: str = "/health"):
    """(process, port) of examples/server started with `flags` once `ready_path` answers 200
    (a failure with its log otherwise)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(SERVER / "server.py"), model_path, "--port", str(port),
         "--lib", str(built / "libvllm.so"), "--uvicorn-log-level", "warning", *flags],
        stdout=log_path.open("w+"), stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 300
    while request(port, "GET", ready_path)[0] != 200:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"server did not become healthy:\n{log_path.read_text()}")
        time.sleep(0.3)
    return proc, port


def start_server(built: Path, model_path: str, env: dict, log_path: Path,
                 max_model_len: int = MAX_MODEL_LEN, extra: tuple[str, ...] = ()):
    """(process, port, log path) of a healthy server; as a new user starts it (extra:
    more flags)."""
    proc, port = launch(built, model_path, env, log_path, (
        "--served-model-name", MODEL, "--max-model-len", str(max_model_len),
        "--max-num-seqs", "8", "--body-read-timeout", str(BODY_READ_TIMEOUT_S), *extra))
    return proc, port, log_path


def server_fixture(label: str, check_log: bool = False):
    """A module-scoped `server` fixture: (port, log path) of start_server's server (its log
    under a folder named label), stopped after the module; check_log: then no_traceback."""
    @pytest.fixture(scope="module")
    def server(built, model_path, child_env, tmp_path_factory):
        proc, port, log = start_server(built, model_path, child_env,
                                       tmp_path_factory.mktemp(label) / "server.log")
        yield port, log
        stop_server(proc)
        if check_log:
            no_traceback(log)
    return server


def stop_server(proc) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def request(port, method, path, body=None, headers=None, timeout=120):
    """(status, headers, body text) of one request; (0, {}, "") if nothing listens."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        res = conn.getresponse()
        return res.status, dict(res.getheaders()), res.read().decode("utf-8", "replace")
    except OSError:
        return 0, {}, ""
    finally:
        conn.close()


def raw(port, data: bytes, timeout: float = 30, then=None) -> bytes:
    """Sends raw bytes (then `then(sock)` if given) and returns what the server answers
    until it closes the connection or `timeout` passes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        if then is not None:
            then(sock)
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except (TimeoutError, ConnectionResetError):
            pass
        return b"".join(chunks)


def error_of(status: int, body: str, want_status: int) -> dict:
    """The OpenAI error object of a response, checked for vLLM's shape and code."""
    assert status == want_status, body
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["code"] == want_status and isinstance(error["message"], str)
    return error


def served(port) -> None:
    """The next ordinary request is served."""
    status, _, body = request(port, "POST", "/v1/completions", headers=JSON, body=json.dumps(
        {"model": MODEL, "prompt": "Hello", "max_tokens": 2, "temperature": 0}))
    assert status == 200, body
    assert json.loads(body)["usage"]["completion_tokens"] == 2


def no_traceback(log_path: Path) -> None:
    text = log_path.read_text(errors="replace")
    assert "Traceback" not in text, text[-4000:]


def metrics(port) -> dict[str, float]:
    status, _, text = request(port, "GET", "/metrics")
    assert status == 200
    return {m[1]: float(m[2]) for m in re.finditer(r"^(vllm:\S+) (\S+)$", text, re.M)}


def rss_mb(pid: int) -> float:
    """The resident set of a process, in MiB (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for process {pid}")
