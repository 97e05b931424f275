"""examples/server /health through libvllm (vLLM's check_health): with the engine core in
its own process (--multiprocessing, on CPU), a SIGKILL of the core turns /health into a
503 within 2 s with no other request sent (the core client notices the dead child by
itself, as vLLM's MPClient process monitor: vllm/v1/engine/core_client.py); the 503
carries the error body. A liveness check with a wide margin (the client's monitor polls
every 0.1 s), not a benchmark.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from hostile_server import request, start_server, stop_server
from test_server_engine_core import _core_pid, _ppid

pytestmark = [pytest.mark.capi, pytest.mark.slow]

DEAD_WITHIN_S = 2.0


@pytest.fixture
def mp_server(built, model_path, child_env, tmp_path):
    proc, port, log = start_server(built, model_path, child_env, tmp_path / "server.log",
                                   extra=("--multiprocessing",))
    yield proc, port
    stop_server(proc)


def test_sigkill_of_the_core_turns_health_503_with_no_request(mp_server):
    proc, port = mp_server
    assert request(port, "GET", "/health")[:1] == (200,)
    core = _core_pid(proc.pid)
    os.kill(core, signal.SIGKILL)
    killed = time.monotonic()
    while (answer := request(port, "GET", "/health", timeout=5))[0] == 200:
        assert time.monotonic() - killed < DEAD_WITHIN_S, "/health still 200"
        time.sleep(0.05)
    status, _, body = answer
    assert status == 503 and time.monotonic() - killed < DEAD_WITHIN_S
    error = json.loads(body)["error"]
    assert error["code"] == 503 and "engine dead" in error["message"], error
    assert _ppid(core) is None  # reaped: no zombie
    assert proc.poll() is None  # the server itself keeps answering


class _FailingEngine:
    """An LLMEngine stand-in whose first step raises (a bug in a step)."""

    is_multiprocess = False

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.engine_core = self

    def add_request(self, request_id, *args, **kwargs) -> None:
        self.requests.append(request_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def step(self):
        raise RuntimeError("a step failed")

    def check_health(self) -> None:
        pass

    def wakeup(self) -> None:
        pass


def test_check_health_raises_engine_dead_once_the_loop_failed():
    from libvllm.engine.async_llm import AsyncLLM
    from libvllm.engine.entrypoints.openai.api import handle_openai_request
    from libvllm.engine.exceptions import EngineDeadError
    from libvllm.engine.sampling_params import SamplingParams

    client = AsyncLLM(_FailingEngine())
    client.check_health()  # alive
    assert handle_openai_request(client, "GET", "/health", "", served_model_name="m").status \
        == 200
    stream = client.add_request("r", [1, 2], SamplingParams(max_tokens=1))
    with pytest.raises(EngineDeadError):
        stream.get(30)
    with pytest.raises(EngineDeadError, match="a step failed"):
        client.check_health()
    result = handle_openai_request(client, "GET", "/health", "", served_model_name="m")
    assert result.status == 503 and "a step failed" in json.loads(result.body)["error"]["message"]
