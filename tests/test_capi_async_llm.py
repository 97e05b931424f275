"""engine/async_llm.py: the background engine loop and per-request streams that the C
ABI's streaming functions and the OpenAI layer use.

Mirrors vLLM 0.33 tests/v1/engine/test_async_llm.py (test_load, test_abort,
test_finished_flag, test_mid_stream_cancellation, test_abort_final_output) with threads
instead of asyncio and sizes cut for CPU; plus ours: the loop's greedy text equals the
caller-driven step() text (oracle: LLMEngine.step on the same engine), push callbacks get
exactly one terminal output, a failing step ends every stream with EngineDeadError, the
idle loop does not spin, shutdown aborts what is live, and get_stats counts. The `llm`
tests run in both engine-core modes: in process and in a child process.
"""

from __future__ import annotations

import threading
import time

import pytest

from libvllm.engine.async_llm import AsyncLLM, EngineClosedError, EngineDeadError
from libvllm.engine.config import EngineConfig
from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.llm_engine import LLMEngine
from libvllm.engine.sampling_params import RequestOutputKind, SamplingParams

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def engine(model_path):
    return LLMEngine.from_config(EngineConfig(model=model_path, max_model_len=256))


@pytest.fixture(scope="module")
def mp_engine(model_path):
    """The same engine with its core in a child process (engine/engine_core/core_client_mp.py)."""
    engine = LLMEngine.from_config(EngineConfig(model=model_path, max_model_len=256,
                                                multiprocessing=True))
    yield engine
    engine.shutdown()


@pytest.fixture(params=["inproc", "mp"])
def llm(request, engine):
    target = engine if request.param == "inproc" else request.getfixturevalue("mp_engine")
    client = AsyncLLM(target)
    yield client
    client.shutdown()
    assert not client._thread.is_alive()
    assert not target.has_unfinished_requests()


def _drain(stream, cancel_after: int | None = None, timeout_s: float = 120.0):
    """(outputs, number of tokens) of one stream, cancelling after cancel_after tokens."""
    outputs, n_tokens = [], 0
    deadline = time.monotonic() + timeout_s
    while not outputs or not outputs[-1].finished:
        assert time.monotonic() < deadline, "stream did not finish"
        out = stream.get(timeout_s=1.0)
        if out is None:
            continue
        outputs.append(out)
        n_tokens += len(out.outputs[0].token_ids)
        if cancel_after is not None and n_tokens >= cancel_after:
            stream.cancel()
    with pytest.raises(EOFError):
        stream.get(0)
    return outputs, n_tokens


def _greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


def test_load(llm):
    """Concurrent requests from several threads each get exactly their tokens."""
    results: dict[str, int] = {}

    def client(i: int) -> None:
        stream = llm.add_request(f"request-{i}", PROMPT, _greedy(6))
        results[stream.request_id] = _drain(stream)[1]

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {f"request-{i}": 6 for i in range(8)}


def test_abort(llm):
    """Aborted requests end with finish_reason "abort"; the others are unaffected; an
    aborted id can be reused."""
    streams = [llm.add_request(f"r{i}", PROMPT, _greedy(200 if i % 3 == 0 else 8))
               for i in range(6)]
    time.sleep(0.2)
    for i in (0, 3):
        llm.abort(f"r{i}")
    for i, stream in enumerate(streams):
        outputs, n = _drain(stream)
        reason = outputs[-1].outputs[0].finish_reason
        assert (reason, i % 3 == 0 or n == 8) == ("abort" if i % 3 == 0 else "length", True)
    llm.abort("r0")  # finished: a no-op
    llm.abort("never-added")
    assert _drain(llm.add_request("r0", PROMPT, _greedy(4)))[1] == 4


def test_finished_flag(llm):
    stream = llm.add_request("request-33", PROMPT,
                             SamplingParams(max_tokens=20, temperature=1.0, seed=33))
    outputs, _ = _drain(stream)
    assert all(not out.finished for out in outputs[:-1])
    assert outputs[-1].finished


def test_finished_flag_parallel_sampling(llm):
    """n = 3: one stream carries every child's deltas; only its last output is finished."""
    stream = llm.add_request("request-n", PROMPT,
                             SamplingParams(max_tokens=8, n=3, seed=3, ignore_eos=True))
    outputs, _ = _drain(stream)
    assert all(not out.finished for out in outputs[:-1]) and outputs[-1].finished
    per_index = {}
    for out in outputs:
        for completion in out.outputs:
            per_index[completion.index] = per_index.get(completion.index, 0) + len(
                completion.token_ids)
    assert per_index == {0: 8, 1: 8, 2: 8}


def test_mid_stream_cancellation(llm):
    """Each of 4 concurrent streams is cancelled once it has 5 tokens (read round-robin, so
    no stream can run to its length cap or EOS first): its last output is an abort."""
    streams = [llm.add_request(f"c{i}", PROMPT, _greedy(500)) for i in range(4)]
    counts, last = [0] * 4, [None] * 4
    deadline = time.monotonic() + 120
    while any(out is None or not out.finished for out in last):
        assert time.monotonic() < deadline, "streams did not finish"
        for i, stream in enumerate(streams):
            if last[i] is not None and last[i].finished:
                continue
            out = stream.get(timeout_s=0.05)
            if out is None:
                continue
            last[i] = out
            counts[i] += len(out.outputs[0].token_ids)
            if counts[i] >= 5:
                stream.cancel()
    assert all(n >= 5 for n in counts)
    assert [out.outputs[0].finish_reason for out in last] == ["abort"] * 4
    assert llm.num_unfinished() == 0
    assert _drain(llm.add_request("c0", PROMPT, _greedy(3)))[1] == 3


def test_abort_final_output(llm):
    stream = llm.add_request("test-abort-final-output", PROMPT,
                             SamplingParams(max_tokens=3000, ignore_eos=True,
                                            temperature=0.5, seed=42))
    first = None
    while first is None:
        first = stream.get(timeout_s=5.0)
    llm.abort("test-abort-final-output")
    outputs, _ = _drain(stream)
    final = outputs[-1]
    assert final.finished and len(final.outputs) == 1
    assert final.outputs[0].finish_reason == "abort"
    assert final.outputs[0].stop_reason is None
    assert final.num_cached_tokens >= 0


def test_loop_greedy_text_equals_caller_driven_step(engine, llm):
    streamed = "".join(o.outputs[0].text for o in _drain(
        llm.add_request("loop", PROMPT, _greedy(12)))[0])
    llm.shutdown()
    engine.add_request("step", PROMPT, _greedy(12, output_kind=RequestOutputKind.DELTA))
    stepped = []
    while engine.has_unfinished_requests():
        stepped += [o.outputs[0].text for o in engine.step()]
    assert streamed == "".join(stepped) and streamed


def test_push_callback_gets_one_terminal_output_on_the_loop_thread(llm):
    seen, done = [], threading.Event()

    def on_output(item):
        seen.append((threading.current_thread().name, item))
        if getattr(item, "finished", True):
            done.set()

    stream = llm.add_request("push", PROMPT, _greedy(5), on_output=on_output)
    assert done.wait(60)
    time.sleep(0.05)
    assert {name for name, _ in seen} == {"vllm-engine-loop"}
    assert [item.finished for _, item in seen].count(True) == 1 and seen[-1][1].finished
    assert sum(len(item.outputs[0].token_ids) for _, item in seen) == 5
    with pytest.raises(EngineClosedError, match="streams to a callback"):
        stream.get(0)


def test_invalid_input_raises_synchronously(llm):
    with pytest.raises(InvalidArgumentError, match="cannot be empty"):
        llm.add_request("empty", [], _greedy(2))
    stream = llm.add_request("dup", PROMPT, _greedy(50))
    with pytest.raises(InvalidArgumentError, match="already in use"):
        llm.add_request("dup", PROMPT, _greedy(2))
    stream.cancel()
    _drain(stream)


def test_failing_step_kills_the_engine(engine, monkeypatch):
    client = AsyncLLM(engine)
    stream = client.add_request("doomed", PROMPT, _greedy(500))
    assert stream.get(timeout_s=60) is not None

    def broken_step():
        raise RuntimeError("boom")

    with client.lock:
        monkeypatch.setattr(engine, "step", broken_step)
    with pytest.raises(EngineDeadError, match="RuntimeError: boom"):
        while stream.get(timeout_s=60) is not None:
            pass
    with pytest.raises(EOFError):
        stream.get(0)
    with pytest.raises(EngineDeadError):
        client.add_request("after", PROMPT, _greedy(2))
    assert client.get_stats()["request_success"]["error"] == 1
    client._thread.join(5)
    assert not client._thread.is_alive()
    monkeypatch.undo()
    engine.shutdown()  # the engine object itself is fine: clear the dead loop's request


def test_idle_loop_does_not_spin(llm):
    before = time.process_time()
    time.sleep(0.5)
    assert time.process_time() - before < 0.2


def test_shutdown_aborts_live_requests_and_refuses_new_ones(engine):
    client = AsyncLLM(engine)
    stream = client.add_request("long", PROMPT, _greedy(1000))
    client.shutdown()
    outputs, _ = _drain(stream)
    assert outputs[-1].outputs[0].finish_reason == "abort"
    with pytest.raises(EngineClosedError, match="shut down"):
        client.add_request("late", PROMPT, _greedy(2))
    assert not client._thread.is_alive()


def test_get_stats_counts_requests_and_tokens(engine):
    client = AsyncLLM(engine)
    prompt = " ".join([PROMPT] * 8)  # several full KV blocks: s2 hits s1's cache
    try:
        _drain(client.add_request("s1", prompt, _greedy(3)))
        _drain(client.add_request("s2", prompt, _greedy(100)), cancel_after=2)
        stats = client.get_stats()
    finally:
        client.shutdown()
    n_prompt = len(engine.tokenizer.encode(prompt))
    assert stats["prompt_tokens"] == 2 * n_prompt
    assert stats["generation_tokens"] >= 5
    assert stats["request_success"]["length"] == 1
    assert stats["request_success"]["abort"] == 1
    assert stats["num_requests_running"] == stats["num_requests_waiting"] == 0
    assert stats["prefix_cache_hits"] > 0
    assert 0.0 <= stats["kv_cache_usage_perc"] <= 1.0
