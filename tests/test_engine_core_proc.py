"""The engine core in a child process (engine/engine_core/core_client_mp.py, engine_core_proc.py).

Oracle: the same engine in process (InprocClient) for greedy text, token ids and
logprobs; vllm.h's contract for the failure paths. Mirrors vLLM 0.33
tests/v1/engine/test_engine_core_client.py (requests, abort, utility calls through the
MP client), tests/v1/shutdown/test_startup_error.py (a start-up failure reaches the
caller) and tests/v1/shutdown/test_forward_error.py (a dead core fails every request
with EngineDeadError, later calls too).
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from libvllm.engine.async_llm import AsyncLLM
from libvllm.engine.config import EngineConfig
from libvllm.engine.errors import ModelLoadError
from libvllm.engine.exceptions import EngineDeadError
from libvllm.engine.llm_engine import LLMEngine
from libvllm.engine.sampling_params import SamplingParams
from libvllm.engine.structured_output.params import StructuredOutputsParams

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"
LONG = " ".join(["one two three four five six seven eight"] * 5)


def _engine(model_path, mp: bool, **kw) -> LLMEngine:
    return LLMEngine.from_config(EngineConfig(model_path, device="cpu", max_model_len=256,
                                              multiprocessing=mp, **kw))


@pytest.fixture(scope="module")
def mp_engine(model_path):
    """With async scheduling (CUDA's default) too: two steps queued in the child."""
    engine = _engine(model_path, True, async_scheduling=True)
    yield engine
    engine.shutdown()


def _run(engine, requests: dict) -> dict:
    for rid, (prompt, sp) in requests.items():
        engine.add_request(rid, prompt, sp)
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    return done


def test_multiprocess_matches_in_process(model_path, mp_engine):
    sp = SamplingParams(temperature=0, max_tokens=10, logprobs=2, prompt_logprobs=1)
    requests = {"a": (PROMPT, sp), "b": ("Hello, my name is", sp.clone())}
    local = _engine(model_path, False)
    try:
        want = _run(local, requests)
    finally:
        local.shutdown()
    got = _run(mp_engine, requests)
    assert mp_engine.is_multiprocess and not local.is_multiprocess
    for rid in requests:
        w, g = want[rid].outputs[0], got[rid].outputs[0]
        assert (g.text, g.token_ids, g.finish_reason) == (w.text, w.token_ids, w.finish_reason)
        assert [list(p) for p in g.logprobs] == [list(p) for p in w.logprobs]
        assert g.cumulative_logprob == pytest.approx(w.cumulative_logprob, abs=1e-4)
        assert len(got[rid].prompt_logprobs) == len(want[rid].prompt_logprobs)


def test_n_abort_and_stats_across_the_split(mp_engine):
    mp_engine.add_request("long", LONG, SamplingParams(max_tokens=200, ignore_eos=True))
    mp_engine.add_request("pair", PROMPT, SamplingParams(n=2, temperature=0.8, seed=1,
                                                         max_tokens=5))
    done, pair = {}, {}
    steps = 0
    while mp_engine.has_unfinished_requests():
        steps += 1
        if steps == 3:
            mp_engine.abort_request("long")
        for out in mp_engine.step():
            if out.finished:
                done[out.request_id] = out
            if out.request_id == "pair":
                pair.update({c.index: c for c in out.outputs})
    assert done["long"].outputs[0].finish_reason == "abort"
    # each RequestOutput of an n > 1 request carries the children that moved in that step
    # (vLLM's ParentRequest, CUMULATIVE): the children reach the core as separate requests,
    # so they may finish in different steps; both must finish
    assert sorted(pair) == [0, 1] and all(c.finish_reason for c in pair.values())
    again = _run(mp_engine, {"again": (LONG, SamplingParams(max_tokens=2))})
    assert again["again"].num_cached_tokens > 0  # the prefix cache of the aborted request
    stats = mp_engine.get_stats()
    assert stats.prefix_cache_hits > 0 and stats.num_running_reqs == 0
    assert mp_engine.reset_prefix_cache() is True
    assert mp_engine.peak_memory_bytes() == 0  # a utility call to the child; CPU: no CUDA


def test_peak_memory_bytes_is_the_cores_allocator_peak(monkeypatch) -> None:
    """The benchmarks' peak-memory row reads the core's process (a child by default on
    CUDA), not the front end's, which never allocates on the device."""
    import types

    import torch

    from libvllm.engine.engine_core.engine_core import EngineCore

    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 123 << 20)
    core = types.SimpleNamespace(device=torch.device("cuda"))
    assert EngineCore.peak_memory_bytes(core) == 123 << 20
    assert EngineCore.peak_memory_bytes(types.SimpleNamespace(device=torch.device("cpu"))) == 0


def test_structured_output_compiles_in_the_child(mp_engine):
    sp = SamplingParams(temperature=0, max_tokens=8, structured_outputs=StructuredOutputsParams(
        choice=["yes", "no"]))
    out = _run(mp_engine, {"so": ("Is Paris in France? Answer:", sp)})["so"]
    assert out.outputs[0].text in ("yes", "no")


def test_start_up_failure_comes_back_with_the_childs_message(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(ModelLoadError) as local:
        _engine(str(bad), False)
    with pytest.raises(ModelLoadError) as remote:
        _engine(str(bad), True)
    assert str(remote.value) == str(local.value)


def _gone(pid: int) -> bool:
    """Reaped (no /proc entry) or at least not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return True


def test_sigkill_of_the_core_ends_every_stream(model_path):
    engine = _engine(model_path, True)
    loop = AsyncLLM(engine)
    proc = engine.engine_core.core.proc
    try:
        streams = [loop.add_request(f"s{i}", PROMPT, SamplingParams(max_tokens=200,
                                                                    ignore_eos=True))
                   for i in range(8)]
        assert streams[0].get(60) is not None  # generation is under way
        os.kill(proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        for stream in streams:
            with pytest.raises(EngineDeadError, match="engine dead.*SIGKILL") as err:
                while stream.get(10) is not None:
                    pass
            assert err.value.status == 9  # the last event of an in-flight request
        with pytest.raises(EngineDeadError) as refused:
            loop.add_request("later", PROMPT, SamplingParams(max_tokens=2))
        assert refused.value.status == 12 and time.monotonic() - killed < 5
        assert proc.poll() is not None and _gone(proc.pid)
    finally:
        loop.shutdown()
        engine.shutdown()


def test_freeze_gc_heap_freezes_what_start_up_left() -> None:
    """vllm/utils/gc_utils.py freeze_gc_heap: after it, the start-up objects sit in the
    permanent generation, which collections never scan."""
    import gc

    from libvllm.engine.engine_core.engine_core_proc import freeze_gc_heap

    keep = [[i] for i in range(1000)]  # tracked objects alive at start-up
    try:
        freeze_gc_heap()
        assert gc.get_freeze_count() >= len(keep)
    finally:
        gc.unfreeze()
