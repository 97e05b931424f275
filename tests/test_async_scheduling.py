"""Async scheduling: the AsyncScheduler's placeholders and the engine's batch queue.

Scheduler cases mirror vLLM 0.33 tests/v1/core/test_async_scheduler.py
(test_stop_by_max_tokens, test_abort, test_prefix_caching_for_prefill_dedup,
test_prefix_caching_for_multi_turn, test_kv_pressure_preemption_with_inflight_output
re-expressed for one token per step and a queue of two steps); the outputs of a step
are handed back one schedule later, as the engine's batch queue does. Engine cases
mirror tests/v1/e2e/general/test_async_scheduling.py (test_without_spec_decoding): on
the real default model, greedy and seeded outputs and logprobs with async scheduling
equal those without it, with preemption and with chunked prefill, for plain sampling,
penalties, bad words, logprobs, prompt logprobs, a JSON schema and (ours) a thinking
budget. Oracle: the
synchronous engine (itself checked against HF transformers in test_sampling_e2e.py).
"""

from __future__ import annotations

import math
from collections import deque

import pytest

from libvllm.engine.config import EngineConfig
from libvllm.engine.core.async_scheduler import AsyncScheduler
from libvllm.engine.core.sched_output import ModelRunnerOutput, SchedulerOutput
from libvllm.engine.llm_engine import LLMEngine
from libvllm.engine.request import Request, RequestStatus
from libvllm.engine.sampling_params import (
    RequestOutputKind,
    SamplingParams,
    StructuredOutputsParams,
)
from tests.test_scheduler import create_requests, create_scheduler


def _runner_output(so: SchedulerOutput, sampling: set[str], step: int = 0
                   ) -> ModelRunnerOutput:
    """A token for each request that samples in `so` (step * 100 + its index)."""
    req_ids = list(so.num_scheduled_tokens)
    return ModelRunnerOutput(req_ids, [[step * 100 + i] if r in sampling else []
                                       for i, r in enumerate(req_ids)])


def _schedule(scheduler) -> tuple[SchedulerOutput, set[str]]:
    so = scheduler.schedule()
    sampling = {r for r in so.num_scheduled_tokens
                if not scheduler.requests[r].is_prefill_chunk}
    return so, sampling


def _run_queued(scheduler, queue: deque, before=None, processed: list | None = None
                ) -> dict[str, list[int]]:
    """Process the oldest step, schedule the next, until nothing is left; returns the
    tokens the runner sampled for each request (also those dropped after a finish).
    `processed` collects the SchedulerOutputs run."""
    emitted: dict[str, list[int]] = {}
    step = 0
    while queue:
        if before is not None:
            before(step)
        so, sampling = queue.popleft()
        if processed is not None:
            processed.append(so)
        out = _runner_output(so, sampling, step)
        for r, toks in zip(out.req_ids, out.sampled_token_ids):
            emitted.setdefault(r, []).extend(toks)
        scheduler.update_from_output(so, out)
        nxt = _schedule(scheduler)
        if nxt[0].num_scheduled_tokens:
            queue.append(nxt)
        step += 1
    return emitted


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5])
def test_stop_by_max_tokens(max_tokens: int):
    scheduler = create_scheduler(async_scheduling=True)
    req0, req1 = create_requests(num_requests=2, max_tokens=max_tokens)
    queue: deque = deque()
    scheduler.add_request(req0)
    queue.append(_schedule(scheduler))
    expected = req0.num_prompt_tokens + max_tokens - 1
    scheduler.add_request(req1)
    queue.append(_schedule(scheduler))
    expected += req1.num_prompt_tokens + max_tokens - 1
    processed: list[SchedulerOutput] = []
    _run_queued(scheduler, queue, processed=processed)
    scheduled = sum(so.total_num_scheduled_tokens for so in processed)
    assert scheduler.get_num_unfinished_requests() == 0
    assert req0.num_output_tokens == max_tokens
    assert req1.num_output_tokens == max_tokens
    assert scheduled == expected  # no step beyond the one that samples the last token


def test_abort():
    scheduler = create_scheduler(async_scheduling=True)
    requests = create_requests(num_requests=10, max_tokens=20)
    for req in requests:
        scheduler.add_request(req)
    queue = deque([_schedule(scheduler), _schedule(scheduler)])
    abort_order = [0, 8, 3, 1, 6, 4, 2, 5, 7, 9]
    pending = list(abort_order)

    def abort(_step):
        if pending:
            scheduler.finish_requests(requests[pending.pop(0)].request_id,
                                      RequestStatus.FINISHED_ABORTED)

    _run_queued(scheduler, queue, before=abort)
    for i, req in enumerate(requests):
        assert req.status == RequestStatus.FINISHED_ABORTED
        assert req.num_output_tokens == abort_order.index(i)


def test_prefix_caching_for_prefill_dedup():
    block_size, num_prompt_tokens = 16, 100
    scheduler = create_scheduler(async_scheduling=True, max_num_batched_tokens=1000,
                                 enable_prefix_caching=True, block_size=block_size)
    requests = create_requests(num_requests=5, num_tokens=num_prompt_tokens, max_tokens=3,
                               same_prompt=True, block_size=block_size)
    req0, req1 = requests.pop(0), requests.pop(0)
    scheduler.add_request(req0)
    scheduler.add_request(req1)
    first = _schedule(scheduler)
    # the two prompts are de-duplicated within the step: all blocks but the last shared
    assert first[0].num_scheduled_tokens == {
        req0.request_id: num_prompt_tokens, req1.request_id: num_prompt_tokens % block_size}
    queue = deque([first, _schedule(scheduler)])
    added: list[Request] = []

    def add(_step):
        if requests:
            added.append(requests.pop(0))
            scheduler.add_request(added[-1])

    _run_queued(scheduler, queue, before=add)
    assert scheduler.get_num_unfinished_requests() == 0
    for req in added:  # each later copy computed only the tail of its prompt
        assert req.num_cached_tokens == num_prompt_tokens // block_size * block_size


def test_prefix_caching_for_multi_turn():
    block_size, num_prompt_tokens, num_output_tokens = 16, 100, 200
    scheduler = create_scheduler(async_scheduling=True, max_num_batched_tokens=1000,
                                 enable_prefix_caching=True, block_size=block_size,
                                 max_model_len=1000)
    requests = create_requests(num_requests=5, num_tokens=num_prompt_tokens,
                               max_tokens=num_output_tokens, block_size=block_size)
    for req in requests:
        scheduler.add_request(req)
    _run_queued(scheduler, deque([_schedule(scheduler), _schedule(scheduler)]))
    assert scheduler.get_num_unfinished_requests() == 0
    # next turn: the prompt is the whole previous conversation
    sp = SamplingParams(max_tokens=num_output_tokens)
    next_turn = [Request(f"next{i}", r.prompt_token_ids + r.output_token_ids, sp, 50256,
                         float(i), block_size) for i, r in enumerate(requests)]
    for req in next_turn:
        scheduler.add_request(req)
    so = scheduler.schedule()
    for req in next_turn:
        assert so.num_scheduled_tokens[req.request_id] == req.num_prompt_tokens % block_size


def test_kv_pressure_preemption_with_inflight_output():
    """A request preempted while its step is in flight still gets that step's token,
    exactly once and in order, and finishes with max_tokens tokens."""
    max_tokens = 24
    # 8 requests of 8 + 24 tokens need 2 blocks of 16 each; 9 blocks force preemptions
    scheduler = create_scheduler(async_scheduling=True, num_blocks=10, block_size=16,
                                 max_model_len=64)
    requests = create_requests(num_requests=8, num_tokens=8, max_tokens=max_tokens,
                               ignore_eos=True)
    pending = list(requests)
    for _ in range(2):
        scheduler.add_request(pending.pop(0))
    preempted_in_flight = []
    preempt = scheduler._preempt_request

    def counting_preempt(request):
        if request.num_output_placeholders > 0:
            preempted_in_flight.append(request.request_id)
        preempt(request)

    scheduler._preempt_request = counting_preempt

    def add(_step):
        if pending:
            scheduler.add_request(pending.pop(0))

    emitted = _run_queued(scheduler, deque([_schedule(scheduler), _schedule(scheduler)]),
                          before=add)
    assert preempted_in_flight, "the case under test did not happen"
    for req in requests:
        assert req.status == RequestStatus.FINISHED_LENGTH_CAPPED
        assert req.num_output_tokens == max_tokens
        assert req.output_token_ids == emitted[req.request_id][:max_tokens]


# --- the engine on the real model: async scheduling changes no output ---------------

PROMPTS = ["The following numbers of the sequence 0, 1, 2, 3, 4, 5 are:",
           "In one word, the capital of France is"]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}},
          "required": ["name"]}
PARAMS = {  # vLLM's list, with a seeded random row added
    "plain": {},
    "frequency_penalty": {"frequency_penalty": -1.0},
    "bad_words": {"bad_words": ["the", " the"]},
    "logprobs": {"logprobs": 2},
    "logprobs_penalty": {"logprobs": 2, "frequency_penalty": -1.0},
    "prompt_logprobs": {"prompt_logprobs": 2, "logprobs": 2},
    "json": {"structured_outputs": StructuredOutputsParams(json=SCHEMA)},
    "json_penalty": {"structured_outputs": StructuredOutputsParams(json=SCHEMA),
                     "logprobs": 2, "frequency_penalty": -1.0},
    "seeded": {"temperature": 1.0, "seed": 7},
    # ours: PROMPTS[0] ends in the start marker (":"), so its end is forced after 3 tokens
    "thinking_budget": {"thinking_token_budget": 3},
}


def _generate(model_path: str, **config) -> tuple[dict[str, tuple], LLMEngine]:
    engine = LLMEngine.from_config(EngineConfig(
        model=model_path, max_model_len=128, max_num_seqs=32, reasoning_start_str=":",
        reasoning_end_str=" So the answer is", **config))
    for name, extra in PARAMS.items():
        for i, prompt in enumerate(PROMPTS):
            sp = SamplingParams(**{"temperature": 0.0, "max_tokens": 12, "min_tokens": 10,
                                   **extra}, output_kind=RequestOutputKind.FINAL_ONLY)
            engine.add_request(f"{name}-{i}", prompt, sp)
    results = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            c = out.outputs[0]
            results[out.request_id] = (list(c.token_ids), c.logprobs, out.prompt_logprobs)
    engine.shutdown()
    return results, engine


def _assert_same(base: dict, other: dict) -> None:
    assert base.keys() == other.keys()
    for rid, (tokens, logprobs, prompt_logprobs) in base.items():
        o_tokens, o_logprobs, o_prompt = other[rid]
        assert o_tokens == tokens, rid
        for a, b in ((logprobs, o_logprobs), (prompt_logprobs, o_prompt)):
            assert (a is None) == (b is None), rid
            for pa, pb in zip(a or [], b or [], strict=True):
                if pa is None:
                    assert pb is None
                    continue
                assert pa.keys() == pb.keys(), rid
                for tok in pa:
                    assert math.isclose(pa[tok].logprob, pb[tok].logprob, abs_tol=1e-4), rid


@pytest.fixture(scope="module")
def sync_outputs(model_path):
    return _generate(model_path, async_scheduling=False)[0]


@pytest.mark.slow
@pytest.mark.parametrize("config", [
    {},
    {"max_num_batched_tokens": 32},  # prompts arrive in chunks
    {"kv_cache_memory_bytes": 16 * 737280},  # 16 blocks of SmolLM2's fp32 KV: preemption
    {"max_num_batched_tokens": 32, "kv_cache_memory_bytes": 16 * 737280},
], ids=["async", "chunked", "preemption", "preemption-chunked"])
def test_async_outputs_equal_sync(model_path, sync_outputs, config):
    results, engine = _generate(model_path, async_scheduling=True, **config)
    assert isinstance(engine.scheduler, AsyncScheduler)
    end = engine.tokenizer.encode(" So the answer is", add_special_tokens=False)
    assert results["thinking_budget-0"][0][3:3 + len(end)] == end  # forced after 3 tokens
    if "kv_cache_memory_bytes" in config:
        assert engine.scheduler.num_preemptions > 0
    _assert_same(sync_outputs, results)


PENALTY_PARAMS = {  # no bad words: nothing makes the engine wait for the step in flight
    "frequency": {"frequency_penalty": -1.0},
    "all": {"frequency_penalty": 0.5, "presence_penalty": -0.8, "repetition_penalty": 1.3,
            "logprobs": 2},
    "seeded": {"temperature": 1.0, "seed": 3, "repetition_penalty": 0.7},
    "plain": {},
}


@pytest.mark.slow
def test_penalties_count_the_token_in_flight(model_path):
    """Penalty rows read the token the step in flight samples on the device (vLLM's MRV2),
    so their steps overlap: async outputs equal the synchronous engine's, and no step
    waited for its predecessor's output."""
    def run(async_scheduling: bool) -> dict:
        engine = LLMEngine.from_config(EngineConfig(
            model=model_path, max_model_len=128, max_num_seqs=8,
            async_scheduling=async_scheduling))
        waited = []
        if async_scheduling:
            schedule = engine.scheduler.schedule

            def spy():
                out = schedule()
                waited.append(out.pending_output_tokens)
                return out
            engine.scheduler.schedule = spy
        for name, extra in PENALTY_PARAMS.items():
            for i, prompt in enumerate(PROMPTS):
                engine.add_request(f"{name}-{i}", prompt, SamplingParams(
                    **{"temperature": 0.0, "max_tokens": 12, "min_tokens": 10, **extra},
                    output_kind=RequestOutputKind.FINAL_ONLY))
        results = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                c = out.outputs[0]
                results[out.request_id] = (list(c.token_ids), c.logprobs, None)
        engine.shutdown()
        assert not any(waited)
        return results

    _assert_same(run(False), run(True))
