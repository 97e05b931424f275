"""Load progress with abort when the engine core runs in a child process
(engine/engine_core/load_progress_relay.py, core_client_mp.py's start-up wait,
engine_core_proc.py): the front end's load_progress reporter sees the child's first
GGUF tensor, then at most one value per 1% of the load, then the last tensor, one round
trip each (bounded, for a model of many tensors), and False at any of them stops the
child's load before the next tensor (LoadCancelledError, VLLM_ERR_CANCELLED, the child
reaped), as in process (tests/test_runtime_progress.py; the C ABI's side is there too).

Oracle: llama.h's progress_callback contract (llama_model_loader calls it per tensor;
false aborts the load), the tensor count of engine/gguf/reader.py on the same file.
Ours (vLLM's engine core sends nothing before its READY handshake).
"""

from __future__ import annotations

import subprocess

import pytest

from libvllm.engine.config import EngineConfig
from libvllm.engine.engine_core import core_client_mp
from libvllm.engine.llm_engine import LLMEngine
from libvllm.engine.load_progress import TENSORS_END, LoadCancelledError, reporting
from libvllm.engine.sampling_params import SamplingParams
from tests.test_runtime_progress import _n_tensors

pytestmark = pytest.mark.slow


def _mp_engine(model_path: str) -> LLMEngine:
    return LLMEngine.from_config(EngineConfig(model_path, device="cpu", max_model_len=256,
                                              multiprocessing=True))


@pytest.fixture
def children(monkeypatch) -> list[subprocess.Popen]:
    """The engine-core processes started by the test."""
    started = []
    launch = core_client_mp.launch_core_process

    def recording_launch(*args, **kwargs):
        core = launch(*args, **kwargs)
        started.append(core.proc)
        return core

    monkeypatch.setattr(core_client_mp, "launch_core_process", recording_launch)
    return started


@pytest.fixture
def round_trips(monkeypatch) -> list[bytes]:
    """The front end's answers to the child's PROGRESS frames (one per round trip)."""
    sent = []
    send = core_client_mp.SyncMPClient._send_load_answer

    def recording_send(self, frame: bytes) -> None:
        sent.append(frame)
        send(self, frame)

    monkeypatch.setattr(core_client_mp.SyncMPClient, "_send_load_answer", recording_send)
    return sent


def test_child_load_reports_in_bounded_round_trips_then_serves(model_path, children,
                                                               round_trips):
    seen = []
    with reporting(lambda fraction: seen.append(fraction) or True):
        engine = _mp_engine(model_path)
    try:
        assert engine.is_multiprocess and len(children) == 1
        n = _n_tensors(model_path)
        assert n > 200 and len(round_trips) == len(seen) <= 100 + 2  # 1%, first, last
        assert seen[0] == pytest.approx(TENSORS_END / n)
        assert all(0 < a < b for a, b in zip(seen, seen[1:]))
        assert seen[-1] == pytest.approx(TENSORS_END)
        engine.add_request("a", "The capital of France is",
                           SamplingParams(temperature=0, max_tokens=2))
        finished = []
        while engine.has_unfinished_requests():
            finished += [out for out in engine.step() if out.finished]
        assert len(finished) == 1 and len(finished[0].outputs[0].token_ids) == 2
    finally:
        engine.shutdown()


def test_abort_at_the_first_progress_stops_the_child_load(model_path, children):
    seen = []
    with reporting(lambda fraction: seen.append(fraction) or False):
        with pytest.raises(LoadCancelledError) as info:
            _mp_engine(model_path)
    n = _n_tensors(model_path)
    assert len(seen) == 1 and 0 < seen[0] < 1  # no call after the abort
    read = round(seen[0] / TENSORS_END * n)
    assert read == 1 < n / 2
    assert f"({read} of {n} tensors read)" in str(info.value)
    assert info.value.status == 13  # VLLM_ERR_CANCELLED
    assert len(children) == 1 and children[0].poll() == 1  # ended by its FAILED path, reaped


def test_abort_part_way_stops_the_child_load(model_path, children, round_trips):
    seen = []
    with reporting(lambda fraction: seen.append(fraction) or fraction < 0.45):
        with pytest.raises(LoadCancelledError) as info:
            _mp_engine(model_path)
    n = _n_tensors(model_path)
    assert seen[-1] >= 0.45 and all(p < 0.45 for p in seen[:-1])  # no call after it
    read = round(seen[-1] / TENSORS_END * n)
    assert n / 2 <= read <= (0.45 + 0.01) / TENSORS_END * n + 1 < n
    assert f"({read} of {n} tensors read)" in str(info.value)
    assert len(round_trips) == len(seen) <= 50
    assert info.value.status == 13  # VLLM_ERR_CANCELLED
    assert len(children) == 1 and children[0].poll() == 1


def test_a_reporter_that_raises_ends_the_child_load_too(model_path, children):
    """The exception reaches the caller, and the child, answered LOAD_ABORT, ends its load
    itself (exit status 1 of its FAILED path; a child left waiting would be signalled)."""

    class Stop(Exception):
        pass

    def reporter(fraction: float) -> bool:
        raise Stop

    with reporting(reporter), pytest.raises(Stop):
        _mp_engine(model_path)
    assert len(children) == 1 and children[0].poll() == 1
