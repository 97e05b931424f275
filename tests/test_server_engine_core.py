"""examples/server with the engine core in its own process (--multiprocessing).

The server's main checks in the multiprocess mode (test_server.py runs the default mode,
in process on CPU): greedy completions equal the C API oracle (build/vllm-cli), streaming,
/metrics across the split; then a SIGKILL of the engine-core
child during 8 streams ends every stream with an error event, new requests get 503, and
no zombie is left. Mirrors vLLM 0.33 tests/v1/shutdown/test_forward_error.py at the
HTTP boundary.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_server import (  # noqa: F401  (c_api: the shared oracle fixture)
    KEY,
    MAX_MODEL_LEN,
    MODEL,
    PROMPT,
    SERVER,
    _auth,
    _free_port,
    _metrics,
    _open_stream,
    _status,
    c_api,
    serving,
)

pytestmark = [pytest.mark.capi, pytest.mark.slow]


@pytest.fixture(scope="module")
def mp_server(built, model_path, child_env, tmp_path_factory, c_api):  # noqa: F811
    port = _free_port()
    log = (tmp_path_factory.mktemp("server-mp") / "server.log").open("w+")
    proc = subprocess.Popen(
        [sys.executable, str(SERVER / "server.py"), model_path, "--port", str(port),
         "--api-key", KEY, "--served-model-name", MODEL, "--max-model-len", str(MAX_MODEL_LEN),
         "--max-num-seqs", "8", "--multiprocessing", "--lib", str(built / "libvllm.so"),
         "--uvicorn-log-level", "warning"],
        stdout=log, stderr=subprocess.STDOUT, env=child_env)
    yield from serving(proc, port, log)


def _core_pid(server_pid: int) -> int:
    (pid,) = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
              and _ppid(int(p.name)) == server_pid
              and b"libvllm.engine.engine_core.engine_core_proc" in _cmdline(int(p.name))]
    return pid


def _ppid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _completion(port: int, **body) -> dict:
    status, _, text = _status(port, "POST", "/v1/completions", headers=_auth(),
                              body=json.dumps({"model": MODEL, **body}))
    assert status == 200, text
    return json.loads(text)


def test_completions_match_c_api(mp_server, c_api):  # noqa: F811
    port = mp_server[1]
    res = _completion(port, prompt=PROMPT, max_tokens=8, temperature=0)
    assert res["choices"][0]["text"] == c_api("generate")
    before = _metrics(port)
    _completion(port, prompt="Hi", max_tokens=3, temperature=0, logprobs=2)
    after = _metrics(port)
    key = 'vllm:generation_tokens_total{engine="0",model_name="smol"}'
    assert after[key] == before[key] + 3


def test_sigkill_of_the_core_fails_streams_and_new_requests(mp_server):
    proc, port = mp_server
    core = _core_pid(proc.pid)
    streams = [_open_stream(port, 400) for _ in range(8)]
    os.kill(core, signal.SIGKILL)
    killed = time.monotonic()
    for conn, res in streams:
        events = [e for e in res.read().decode().split("\n\n") if e]
        conn.close()
        assert events[-1] == "data: [DONE]"
        error = json.loads(events[-2][len("data: "):])["error"]
        assert "engine dead" in error["message"] and error["code"] == 500
    status, _, body = _status(port, "POST", "/v1/completions", headers=_auth(),
                              body=json.dumps({"model": MODEL, "prompt": "x"}))
    assert status == 503 and "engine dead" in json.loads(body)["error"]["message"]
    assert _status(port, "GET", "/health")[0] == 503  # vLLM's check_health
    assert time.monotonic() - killed < 30
    assert _ppid(core) is None  # reaped by the server: no zombie left
    assert proc.poll() is None  # the server itself keeps answering
