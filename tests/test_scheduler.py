"""Scheduler: token budget, chunked prefill, FCFS/priority policies, preemption, abort,
stop conditions, prefix-cache stats.

Mirrors vLLM 0.33 tests/v1/core/test_scheduler.py, test_priority_preemption_bug.py and
test_priority_scheduler_random.py (helpers from tests/v1/core/utils.py), re-expressed
for our API: one token per step from the runner, resumed requests come back as
NewRequestData (vLLM's v2 model-runner form), update_from_output returns
(request, new token ids) pairs. Oracle: the upstream expectations; the block arithmetic
of our own cases is written in their comments. Cases for multimodal, LoRA, spec decode,
KV/EC connectors, structured output and DP throttling are not ported: those features do
not exist in this engine (see .agents/specs/engine-core.md). Async scheduling has its
own file, tests/test_async_scheduling.py.
"""

from __future__ import annotations

import random

import pytest

from libvllm.engine.config import EngineConfig
from libvllm.engine.core.async_scheduler import AsyncScheduler
from libvllm.engine.core.kv_cache_manager import KVCacheManager
from libvllm.engine.core.sched_output import CachedRequestData, ModelRunnerOutput, SchedulerOutput
from libvllm.engine.core.sched_utils import check_stop
from libvllm.engine.core.scheduler import Scheduler
from libvllm.engine.errors import InvalidArgumentError, OutOfResourcesError
from libvllm.engine.request import Request, RequestStatus
from libvllm.engine.resolved_config import SchedulerConfig
from libvllm.engine.sampling_params import SamplingParams
from libvllm.engine.stats_aggregator import StatsAggregator

EOS_TOKEN_ID = 50256


def create_scheduler(max_num_seqs: int = 16, max_num_batched_tokens: int = 8192,
                     enable_chunked_prefill: bool = True, enable_prefix_caching: bool = False,
                     long_prefill_token_threshold: int = 0,
                     long_prefill_token_threshold_adaptive: bool = False,
                     num_blocks: int = 10000, block_size: int = 16,
                     max_model_len: int | None = None, scheduling_policy: str = "fcfs",
                     scheduler_reserve_full_isl: bool = True, log_stats: bool = True,
                     async_scheduling: bool = False) -> Scheduler:
    if max_model_len is None:
        max_model_len = max_num_batched_tokens
    config = EngineConfig(
        model="unused", max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        enable_chunked_prefill=enable_chunked_prefill,
        enable_prefix_caching=enable_prefix_caching,
        long_prefill_token_threshold=long_prefill_token_threshold,
        long_prefill_token_threshold_adaptive=long_prefill_token_threshold_adaptive,
        scheduling_policy=scheduling_policy,
        scheduler_reserve_full_isl=scheduler_reserve_full_isl)
    kv = KVCacheManager(num_blocks, block_size, max_model_len, enable_prefix_caching,
                        log_stats=log_stats, watermark=config.watermark)
    scheduler_cls = AsyncScheduler if async_scheduling else Scheduler
    sched_config = SchedulerConfig.from_engine_config(
        config, max_model_len, max_num_seqs, max_num_batched_tokens, async_scheduling)
    return scheduler_cls(sched_config, kv, log_stats=log_stats)


def create_requests(num_requests: int, num_tokens: int = 10, ignore_eos: bool = False,
                    max_tokens: int = 16, stop_token_ids: list[int] | None = None,
                    prompt_logprobs: int | None = None, same_prompt: bool = False,
                    block_size: int = 16, req_ids: list[str] | None = None,
                    priorities: list[int] | None = None,
                    arrival_times: list[float] | None = None, starting_idx: int = 0
                    ) -> list[Request]:
    req_ids = req_ids or [f"{i + starting_idx}" for i in range(num_requests)]
    priorities = priorities or [0] * num_requests
    arrival_times = arrival_times or [float(i) for i in range(num_requests)]
    requests = []
    for i in range(num_requests):
        sp = SamplingParams(ignore_eos=ignore_eos, max_tokens=max_tokens,
                            stop_token_ids=stop_token_ids, prompt_logprobs=prompt_logprobs)
        token = starting_idx if same_prompt else i + starting_idx
        req = Request(req_ids[i], [token] * num_tokens, sp, EOS_TOKEN_ID, arrival_times[i],
                      block_size, priority=priorities[i])
        requests.append(req)
    return requests


def runner_output(req_ids: list[str], sampled: list[list[int]]) -> ModelRunnerOutput:
    return ModelRunnerOutput(req_ids=list(req_ids), sampled_token_ids=sampled)


def mock_output(scheduler: Scheduler, out: SchedulerOutput, tok: int = 100
                ) -> ModelRunnerOutput:
    """What the runner returns: a token for every request that reached its end."""
    ids = list(out.num_scheduled_tokens)
    return runner_output(ids, [
        [tok] if scheduler.requests[r].num_computed_tokens >= scheduler.requests[r].num_tokens
        else [] for r in ids])


def step(scheduler: Scheduler, tok: int = 100):
    out = scheduler.schedule()
    return out, scheduler.update_from_output(out, mock_output(scheduler, out, tok))


def test_add_requests():
    scheduler = create_scheduler()
    requests = create_requests(num_requests=10)
    for i, request in enumerate(requests):
        scheduler.add_request(request)
        assert request.request_id in scheduler.requests
        assert len(scheduler.waiting) == i + 1


def test_finish_request():
    scheduler = create_scheduler()
    requests = create_requests(num_requests=10)
    for request in requests:
        scheduler.add_request(request)
    for i, request in enumerate(requests):
        scheduler.finish_requests(request.request_id, RequestStatus.FINISHED_ABORTED)
        assert request.request_id not in scheduler.requests
        assert len(scheduler.waiting) == 9 - i


def test_get_num_unfinished_requests():
    scheduler = create_scheduler()
    requests = create_requests(num_requests=10)
    for request in requests:
        scheduler.add_request(request)
    for i, request in enumerate(requests):
        scheduler.finish_requests(request.request_id, RequestStatus.FINISHED_STOPPED)
        assert scheduler.get_num_unfinished_requests() == len(requests) - i - 1


@pytest.mark.parametrize("enable_prefix_caching, prompt_logprobs", [(False, None),
                                                                     (True, 5)])
def test_schedule(enable_prefix_caching: bool, prompt_logprobs: int | None):
    """Default; prefix caching on + prompt logprobs (which skip reading the cache)."""
    scheduler = create_scheduler(enable_prefix_caching=enable_prefix_caching)
    requests = create_requests(num_requests=10, prompt_logprobs=prompt_logprobs)
    for request in requests:
        scheduler.add_request(request)
    output = scheduler.schedule()
    assert len(output.scheduled_new_reqs) == len(requests)
    assert output.scheduled_cached_reqs.num_reqs == 0
    assert len(output.finished_req_ids) == 0
    for req_id, num_tokens in output.num_scheduled_tokens.items():
        assert num_tokens == len(requests[int(req_id)].prompt_token_ids)
    assert len(scheduler.waiting) == 0
    assert len(scheduler.running) == len(requests)
    for i, request in enumerate(requests):
        assert scheduler.running[i] == request


@pytest.mark.parametrize("enable_prefix_caching", [True, False])
def test_schedule_concurrent_partial_requests(enable_prefix_caching: bool):
    scheduler = create_scheduler(max_num_batched_tokens=1024, long_prefill_token_threshold=400,
                                 enable_prefix_caching=enable_prefix_caching)
    requests = create_requests(num_requests=3, num_tokens=800)
    for request in requests:
        scheduler.add_request(request)
    output = scheduler.schedule()
    assert len(output.scheduled_new_reqs) == 3
    assert output.scheduled_cached_reqs.num_reqs == 0
    assert len(output.finished_req_ids) == 0
    assert [output.num_scheduled_tokens[r.request_id] for r in requests] == [400, 400, 224]
    ids = [r.request_id for r in requests]
    scheduler.update_from_output(output, runner_output(ids, [[], [], []]))

    output1 = scheduler.schedule()
    assert len(scheduler.running) == 3
    assert len(output1.scheduled_new_reqs) == 0
    assert output1.scheduled_cached_reqs.num_reqs == 3
    assert len(output1.finished_req_ids) == 0
    assert [output1.num_scheduled_tokens[r.request_id] for r in requests] == [400, 400, 224]

    scheduler.update_from_output(output1, runner_output(ids, [[0], [0], []]))
    output2 = scheduler.schedule()
    assert len(scheduler.running) == 3
    assert len(output2.scheduled_new_reqs) == 0
    assert output2.scheduled_cached_reqs.num_reqs == 3
    assert len(output2.finished_req_ids) == 0
    assert [output2.num_scheduled_tokens[r.request_id] for r in requests] == \
        [1, 1, 800 - 224 - 224]


def test_long_prefill_threshold_ignored_when_alone():
    scheduler = create_scheduler(max_num_batched_tokens=1024, long_prefill_token_threshold=400,
                                 max_model_len=4096)
    request = create_requests(num_requests=1, num_tokens=2000)[0]
    scheduler.add_request(request)
    assert scheduler.schedule().num_scheduled_tokens[request.request_id] == 1024


def test_long_prefill_threshold_applies_with_other_requests():
    scheduler = create_scheduler(max_num_batched_tokens=1024, long_prefill_token_threshold=400,
                                 max_model_len=4096)
    long_req = create_requests(num_requests=1, num_tokens=2000)[0]
    short_req = create_requests(num_requests=1, num_tokens=10, req_ids=["short"])[0]
    for request in [long_req, short_req]:
        scheduler.add_request(request)
    output = scheduler.schedule()
    assert output.num_scheduled_tokens[long_req.request_id] == 400
    assert output.num_scheduled_tokens[short_req.request_id] == 10


def test_long_prefill_threshold_floored_by_fair_share():
    scheduler = create_scheduler(max_num_batched_tokens=1024, long_prefill_token_threshold=100,
                                 long_prefill_token_threshold_adaptive=True,
                                 max_model_len=4096)
    long_req = create_requests(num_requests=1, num_tokens=2000)[0]
    short_req = create_requests(num_requests=1, num_tokens=10, req_ids=["short"])[0]
    for request in [long_req, short_req]:
        scheduler.add_request(request)
    output = scheduler.schedule()
    assert output.num_scheduled_tokens[long_req.request_id] == 512  # 1024 // 2
    assert output.num_scheduled_tokens[short_req.request_id] == 10


def _running(scheduler: Scheduler, requests: list[Request]) -> None:
    for req in requests:
        req.num_computed_tokens = req.num_tokens
        scheduler.requests[req.request_id] = req
        scheduler.running.append(req)
        req.status = RequestStatus.RUNNING


def _sched_out(num_scheduled: dict[str, int]) -> SchedulerOutput:
    return SchedulerOutput(scheduled_new_reqs=[], scheduled_cached_reqs=CachedRequestData(),
                           num_scheduled_tokens=num_scheduled,
                           total_num_scheduled_tokens=sum(num_scheduled.values()),
                           finished_req_ids=set())


def test_stop_via_update_from_output():
    # case 1: EOS
    scheduler = create_scheduler()
    requests = create_requests(num_requests=2, max_tokens=10)
    _running(scheduler, requests)
    results = scheduler.update_from_output(
        _sched_out({"0": 1, "1": 1}), runner_output(["0", "1"], [[EOS_TOKEN_ID], [10]]))
    assert len(scheduler.running) == 1
    assert scheduler.running[0].request_id == "1"
    assert requests[0].status == RequestStatus.FINISHED_STOPPED
    assert "0" in scheduler.finished_req_ids
    assert list(requests[0].output_token_ids) == [EOS_TOKEN_ID]
    assert list(requests[1].output_token_ids) == [10]
    assert [(r.request_id, ids) for r, ids in results] == [("0", [EOS_TOKEN_ID]), ("1", [10])]

    # case 2: custom stop token; tokens after it are trimmed
    scheduler = create_scheduler()
    requests = create_requests(num_requests=2, max_tokens=10, stop_token_ids=[42, 43])
    _running(scheduler, requests)
    scheduler.update_from_output(_sched_out({"0": 1, "1": 1}),
                                 runner_output(["0", "1"], [[10, 42, 12], [13, 14]]))
    assert len(scheduler.running) == 1
    assert scheduler.running[0].request_id == "1"
    assert requests[0].status == RequestStatus.FINISHED_STOPPED
    assert requests[0].stop_reason == 42
    assert "0" in scheduler.finished_req_ids
    assert list(requests[0].output_token_ids) == [10, 42]
    assert list(requests[1].output_token_ids) == [13, 14]

    # case 3: max tokens
    scheduler = create_scheduler()
    requests = create_requests(num_requests=2, max_tokens=2)
    _running(scheduler, requests)
    scheduler.update_from_output(_sched_out({"0": 1, "1": 1}),
                                 runner_output(["0", "1"], [[10, 11, 12], [13]]))
    assert len(scheduler.running) == 1
    assert scheduler.running[0].request_id == "1"
    assert requests[0].status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert "0" in scheduler.finished_req_ids
    assert list(requests[0].output_token_ids) == [10, 11]
    assert list(requests[1].output_token_ids) == [13]

    # case 4: ignore_eos
    scheduler = create_scheduler()
    requests = create_requests(num_requests=1, max_tokens=10, ignore_eos=True)
    _running(scheduler, requests)
    scheduler.update_from_output(_sched_out({"0": 1}),
                                 runner_output(["0"], [[EOS_TOKEN_ID, 10, 11]]))
    assert len(scheduler.running) == 1
    assert not requests[0].is_finished()
    assert list(requests[0].output_token_ids) == [EOS_TOKEN_ID, 10, 11]


def test_update_from_output_ignores_unscheduled_and_unknown_requests():
    scheduler = create_scheduler()
    requests = create_requests(num_requests=2)
    _running(scheduler, requests)
    results = scheduler.update_from_output(
        _sched_out({"0": 1, "gone": 1}), runner_output(["1", "0", "gone"], [[5], [6], [7]]))
    assert [(r.request_id, ids) for r, ids in results] == [("0", [6])]
    assert list(requests[1].output_token_ids) == []


def _req(req_id: str, sp: SamplingParams) -> Request:
    return Request(req_id, [0, 1, 2], sp, EOS_TOKEN_ID, 0.0, 16)


def test_check_stop_min_tokens():
    sp = SamplingParams(ignore_eos=False, max_tokens=20, min_tokens=5)
    request = _req("0", sp)
    request.append_output_token_ids([10, 11, 12])
    assert check_stop(request, max_model_len=100) is False

    request_eos = _req("eos", sp)
    request_eos.append_output_token_ids([10, 11, EOS_TOKEN_ID])
    assert check_stop(request_eos, max_model_len=100) is True
    assert request_eos.status == RequestStatus.FINISHED_STOPPED

    request_ignore_eos = _req("ignore-eos", SamplingParams(ignore_eos=True, max_tokens=20,
                                                           min_tokens=5))
    request_ignore_eos.append_output_token_ids([EOS_TOKEN_ID])
    assert check_stop(request_ignore_eos, max_model_len=100) is False

    request_no_min = _req("1", SamplingParams(ignore_eos=False, max_tokens=20, min_tokens=0))
    request_no_min.append_output_token_ids([10, EOS_TOKEN_ID])
    assert check_stop(request_no_min, max_model_len=100) is True
    assert request_no_min.status == RequestStatus.FINISHED_STOPPED

    request_stop = _req("2", SamplingParams(ignore_eos=False, max_tokens=20, min_tokens=5,
                                            stop_token_ids=[42]))
    request_stop.append_output_token_ids([10, 11, 42])
    assert check_stop(request_stop, max_model_len=100) is True
    assert request_stop.status == RequestStatus.FINISHED_STOPPED
    assert request_stop.stop_reason == 42


def test_check_stop_length_cap_below_min_tokens():
    request = _req("0", SamplingParams(ignore_eos=True, max_tokens=500, min_tokens=500))
    request.append_output_token_ids([10, 11, 12, 13, 14, 15, 16])  # num_tokens == 10
    assert check_stop(request, max_model_len=10) is True
    assert request.status == RequestStatus.FINISHED_LENGTH_CAPPED

    sp_capped = SamplingParams(ignore_eos=True, max_tokens=500, min_tokens=500)
    sp_capped.max_tokens = 3
    request_capped = _req("1", sp_capped)
    request_capped.append_output_token_ids([10, 11, 12])
    assert check_stop(request_capped, max_model_len=100) is True
    assert request_capped.status == RequestStatus.FINISHED_LENGTH_CAPPED


@pytest.mark.parametrize("enable_prefix_caching, prompt_logprobs", [(False, None),
                                                                     (True, 5)])
def test_schedule_concurrent_batches(enable_prefix_caching: bool,
                                     prompt_logprobs: int | None):
    scheduler = create_scheduler(max_num_batched_tokens=1024, max_num_seqs=2,
                                 enable_prefix_caching=enable_prefix_caching)
    requests = create_requests(num_requests=2, num_tokens=512,
                               prompt_logprobs=prompt_logprobs)
    scheduler.add_request(requests[0])
    out0 = scheduler.schedule()
    assert len(out0.scheduled_new_reqs) == 1
    assert out0.num_scheduled_tokens["0"] == 512
    # the first request has nothing left to compute: only the second is scheduled
    scheduler.add_request(requests[1])
    out1 = scheduler.schedule()
    assert len(out1.scheduled_new_reqs) == 1
    assert out1.num_scheduled_tokens == {"1": 512}
    scheduler.update_from_output(out0, runner_output(["0"], [[0]]))
    out2 = scheduler.schedule()
    assert out2.num_scheduled_tokens["0"] == 1
    scheduler.update_from_output(out1, runner_output(["1"], [[0]]))


@pytest.mark.parametrize("enable_chunked_prefill", [True, False])
def test_schedule_order(enable_chunked_prefill: bool):
    scheduler = create_scheduler(max_num_batched_tokens=1024, max_num_seqs=3,
                                 enable_chunked_prefill=enable_chunked_prefill)
    requests = create_requests(num_requests=2, num_tokens=800, req_ids=["1", "2"])
    requests += create_requests(num_requests=2, num_tokens=10, req_ids=["3", "4"])
    for request in requests:
        scheduler.add_request(request)
    out = scheduler.schedule()
    if enable_chunked_prefill:
        assert len(out.scheduled_new_reqs) == 2  # the long requests are chunked
    else:
        # a long prompt is never split, and the short ones behind it are not jumped ahead
        assert len(out.scheduled_new_reqs) == 1
        assert out.num_scheduled_tokens == {"1": 800}


def test_preempt_during_execution():
    """10 usable blocks, two 80-token requests (5 blocks each); the first one's 81st
    token needs a 6th block, so the newest request is preempted. (The upstream tail that
    delivers the preempted request's in-flight output is async-scheduling only.)"""
    scheduler = create_scheduler(max_num_batched_tokens=100, block_size=16, num_blocks=11)
    requests = create_requests(num_requests=2, num_tokens=80, block_size=16)
    scheduler.add_request(requests[0])
    out0 = scheduler.schedule()
    assert len(out0.num_scheduled_tokens) == 1
    assert len(out0.scheduled_new_reqs[0].block_ids) == 5
    scheduler.add_request(requests[1])
    out1 = scheduler.schedule()
    assert len(out1.num_scheduled_tokens) == 1
    assert len(out1.scheduled_new_reqs[0].block_ids) == 5
    scheduler.update_from_output(out0, runner_output(["0"], [[0]]))
    out2 = scheduler.schedule()
    assert len(scheduler.running) == 1
    assert scheduler.running[0] == requests[0]
    assert requests[1].status == RequestStatus.PREEMPTED
    assert out2.preempted_req_ids == {"1"}
    assert "1" not in out2.finished_req_ids


def test_preemption_re_records_prefix_cache_query():
    scheduler = create_scheduler(enable_prefix_caching=True)
    request = create_requests(num_requests=1)[0]
    scheduler.add_request(request)
    scheduler.schedule()
    stats = scheduler.kv_cache_manager.prefix_cache_stats
    assert (stats.requests, stats.preempted_requests) == (1, 0)
    scheduler.running.remove(request)
    scheduler._preempt_request(request)
    assert request.status == RequestStatus.PREEMPTED
    scheduler.schedule()
    assert request.status == RequestStatus.RUNNING
    assert stats.preempted_requests == 1


def test_prefix_cache_stats_not_recorded_when_caching_disabled():
    scheduler = create_scheduler(enable_prefix_caching=False)
    for request in create_requests(num_requests=2):
        scheduler.add_request(request)
    scheduler.schedule()
    stats = scheduler.kv_cache_manager.prefix_cache_stats
    assert (stats.requests, stats.queries, stats.hits) == (0, 0, 0)


def test_prefix_cache_stats_counted_once_for_retried_then_scheduled_request():
    block_size = 16
    scheduler = create_scheduler(enable_prefix_caching=True, enable_chunked_prefill=False,
                                 block_size=block_size)
    seed = create_requests(num_requests=1, num_tokens=block_size * 2, max_tokens=2,
                           same_prompt=True, req_ids=["seed"])[0]
    scheduler.add_request(seed)
    while scheduler.has_unfinished_requests():
        step(scheduler, tok=1000)
    scheduler.make_stats()  # the engine drains the accumulator every step
    stats = scheduler.kv_cache_manager.prefix_cache_stats
    assert (stats.requests, stats.queries, stats.hits) == (0, 0, 0)

    retried = create_requests(num_requests=1, num_tokens=block_size * 3, max_tokens=1,
                              same_prompt=True, req_ids=["retried"])[0]
    scheduler.add_request(retried)
    orig_allocate_slots = scheduler.kv_cache_manager.allocate_slots
    allocate_results: list = []

    def spy_allocate_slots(*args, **kwargs):
        result = orig_allocate_slots(*args, **kwargs) if allocate_results else None
        allocate_results.append(result)
        return result

    scheduler.kv_cache_manager.allocate_slots = spy_allocate_slots
    assert not scheduler.schedule().scheduled_new_reqs
    assert (stats.requests, stats.queries, stats.hits) == (0, 0, 0)
    assert "retried" in scheduler.schedule().num_scheduled_tokens
    assert allocate_results[0] is None and allocate_results[1] is not None
    assert (stats.requests, stats.queries, stats.hits) == (1, retried.num_tokens,
                                                           block_size * 2)


def test_scheduler_reset_prefix_cache():
    scheduler = create_scheduler(enable_prefix_caching=True)
    requests = create_requests(num_requests=10)
    for request in requests:
        scheduler.add_request(request)
    scheduler.schedule()
    assert len(scheduler.waiting) == 0
    assert len(scheduler.running) == len(requests)
    assert not scheduler.reset_prefix_cache()  # running requests hold blocks
    assert scheduler.reset_prefix_cache(reset_running_requests=True)
    assert len(scheduler.waiting) == len(requests)
    assert len(scheduler.running) == 0
    for i, request in enumerate(requests):
        assert scheduler.waiting[i] == request
        assert request.status == RequestStatus.PREEMPTED


def assert_scheduler_empty(scheduler: Scheduler) -> None:
    assert len(scheduler.requests) == 0
    assert len(scheduler.waiting) == 0
    assert len(scheduler.running) == 0
    assert len(scheduler.finished_req_ids) == 0
    manager = scheduler.kv_cache_manager.single_type_manager
    assert len(manager.req_to_blocks) == 0
    assert len(manager.num_cached_block) == 0
    pool = scheduler.kv_cache_manager.block_pool
    assert pool.free_block_queue.num_free_blocks == pool.num_gpu_blocks - 1
    for block in pool.blocks:
        assert block.ref_cnt == 0


def make_output(scheduler: Scheduler) -> ModelRunnerOutput:
    return runner_output([r.request_id for r in scheduler.running],
                         [[1000]] * len(scheduler.running))


def test_memory_leak():
    scheduler = create_scheduler(enable_prefix_caching=True)
    requests = create_requests(num_requests=5, num_tokens=10, max_tokens=10)
    for request in requests:
        scheduler.add_request(request)
        out = scheduler.schedule()
        scheduler.update_from_output(out, make_output(scheduler))
    while True:
        out = scheduler.schedule()
        if len(scheduler.running) == 0:
            break
        scheduler.update_from_output(out, make_output(scheduler))
    assert_scheduler_empty(scheduler)


def create_scheduler_with_priority(**kwargs) -> Scheduler:
    return create_scheduler(scheduling_policy="priority", **kwargs)


def create_requests_with_priority(num_requests: int, priorities: list[int],
                                  arrival_times: list[float] | None = None, **kwargs
                                  ) -> list[Request]:
    return create_requests(num_requests, priorities=priorities, arrival_times=arrival_times,
                           **kwargs)


def _new_ids(output: SchedulerOutput) -> list[str]:
    return [req.req_id for req in output.scheduled_new_reqs]


def test_priority_scheduling_basic_ordering():
    scheduler = create_scheduler_with_priority()
    requests = create_requests_with_priority(3, [2, 0, 1], [1.0, 2.0, 3.0])
    for request in requests:
        scheduler.add_request(request)
    output = scheduler.schedule()
    assert _new_ids(output) == ["1", "2", "0"]


def test_priority_scheduling_arrival_time_tiebreaker():
    scheduler = create_scheduler_with_priority()
    requests = create_requests_with_priority(3, [1, 1, 1], [3.0, 1.0, 2.0])
    for request in requests:
        scheduler.add_request(request)
    assert _new_ids(scheduler.schedule()) == ["1", "2", "0"]


def test_priority_scheduling_mixed_priority_and_arrival():
    scheduler = create_scheduler_with_priority()
    requests = create_requests_with_priority(4, [2, 1, 1, 0], [1.0, 3.0, 2.0, 4.0])
    for request in requests:
        scheduler.add_request(request)
    assert _new_ids(scheduler.schedule()) == ["3", "2", "1", "0"]


def test_priority_scheduling_preemption():
    """5 usable blocks of 16. lo1 (priority 5, 32 tokens) runs; hi1 (priority 0, 32
    tokens) is admitted (5 blocks used); when hi1 needs a 3rd block, lo1 is the victim."""
    block_size = 16
    scheduler = create_scheduler_with_priority(max_num_seqs=3, max_num_batched_tokens=200,
                                               num_blocks=6, block_size=block_size)
    lo1 = create_requests_with_priority(1, [5], [1.0], num_tokens=32, req_ids=["lo1"])[0]
    scheduler.add_request(lo1)
    output = scheduler.schedule()
    assert len(output.scheduled_new_reqs) == 1
    scheduler.update_from_output(output, runner_output(["lo1"], [[100]]))

    hi1 = create_requests_with_priority(1, [0], [2.0], num_tokens=32, req_ids=["hi1"])[0]
    scheduler.add_request(hi1)
    output = scheduler.schedule()
    assert "hi1" in _new_ids(output)
    assert len(scheduler.running) == 2
    scheduler.update_from_output(output, runner_output(["lo1", "hi1"], [[101], [100]]))

    output = scheduler.schedule()
    assert scheduler.requests["lo1"].status == RequestStatus.PREEMPTED
    assert any(req.request_id == "hi1" for req in scheduler.running)
    assert output.preempted_req_ids == {"lo1"}
    assert "lo1" not in output.num_scheduled_tokens


def test_priority_scheduling_no_preemption_when_space_available():
    scheduler = create_scheduler_with_priority(max_num_seqs=3, max_num_batched_tokens=200)
    low = create_requests_with_priority(2, [5, 5], [1.0, 2.0], num_tokens=30,
                                        req_ids=["lo1", "lo2"])
    for request in low:
        scheduler.add_request(request)
    output = scheduler.schedule()
    scheduler.update_from_output(output, runner_output(["lo1", "lo2"], [[100], [100]]))
    high = create_requests_with_priority(1, [0], [3.0], num_tokens=30, req_ids=["hi1"])[0]
    scheduler.add_request(high)
    output = scheduler.schedule()
    assert len(output.scheduled_new_reqs) == 1
    assert len(scheduler.running) == 3
    assert len(scheduler.waiting) == 0


def test_priority_scheduling_preemption_victim_selection():
    scheduler = create_scheduler_with_priority(max_num_seqs=1)
    requests = create_requests_with_priority(3, [3, 2, 0], [1.0, 2.0, 3.0], num_tokens=10)
    for request in requests:
        scheduler.add_request(request)
    output = scheduler.schedule()
    assert _new_ids(output) == ["2"]
    waiting = list(scheduler.waiting)
    assert [r.priority for r in waiting] == [2, 3]
    assert [r.request_id for r in waiting] == ["1", "0"]


def test_priority_scheduling_equal_priority_preemption():
    scheduler = create_scheduler_with_priority(max_num_seqs=1)
    requests = create_requests_with_priority(3, [2, 2, 2], [3.0, 1.0, 2.0], num_tokens=10)
    for request in requests:
        scheduler.add_request(request)
    assert _new_ids(scheduler.schedule()) == ["1"]
    waiting = list(scheduler.waiting)
    assert [r.arrival_time for r in waiting] == [2.0, 3.0]
    assert [r.request_id for r in waiting] == ["2", "0"]


def test_priority_scheduling_waiting_queue_order():
    scheduler = create_scheduler_with_priority(max_num_seqs=1)
    requests = create_requests_with_priority(4, [3, 1, 2, 0], [1.0, 2.0, 3.0, 4.0])
    for request in requests:
        scheduler.add_request(request)
    assert _new_ids(scheduler.schedule()) == ["3"]
    waiting = list(scheduler.waiting)
    assert [r.request_id for r in waiting] == ["1", "2", "0"]
    assert [r.priority for r in waiting] == [1, 2, 3]


def test_priority_scheduling_fcfs_fallback():
    scheduler = create_scheduler_with_priority()
    requests = create_requests_with_priority(4, [1, 1, 1, 1], [4.0, 1.0, 3.0, 2.0])
    for request in requests:
        scheduler.add_request(request)
    assert _new_ids(scheduler.schedule()) == ["1", "3", "2", "0"]


def test_priority_scheduling_with_limited_slots():
    scheduler = create_scheduler_with_priority(max_num_seqs=2, max_num_batched_tokens=1000)
    requests = create_requests_with_priority(4, [3, 1, 2, 0], [1.0, 2.0, 3.0, 4.0])
    for request in requests:
        scheduler.add_request(request)
    output = scheduler.schedule()
    assert sorted(_new_ids(output)) == ["1", "3"]
    waiting = list(scheduler.waiting)
    assert [r.priority for r in waiting] == [2, 3]
    assert [r.request_id for r in waiting] == ["2", "0"]


def test_priority_scheduling_heap_property():
    scheduler = create_scheduler_with_priority(max_num_seqs=1)
    priorities = [5, 1, 8, 3, 2, 7, 4, 6]
    requests = create_requests_with_priority(len(priorities), priorities, num_tokens=10)
    for request in requests:
        scheduler.add_request(request)
    scheduled_priorities = []
    while scheduler.waiting:
        output = scheduler.schedule()
        if output.scheduled_new_reqs:
            req_id = output.scheduled_new_reqs[0].req_id
            scheduled_priorities.append(requests[int(req_id)].priority)
            scheduler.update_from_output(output, runner_output([req_id], [[100]]))
            scheduler.finish_requests(req_id, RequestStatus.FINISHED_STOPPED)
    assert scheduled_priorities == sorted(priorities)


def test_priority_scheduling_preemption_and_resumption_when_out_of_kv():
    """4 usable blocks of 16: low (30 tokens, 2 blocks) + high (32 tokens, 2 blocks) fill
    the pool; high's 33rd token needs a 3rd block, so low is preempted (its tokens this
    step are given back), then resumed with its 32 tokens once high finishes."""
    scheduler = create_scheduler_with_priority(max_num_seqs=2, max_num_batched_tokens=200,
                                               num_blocks=5, block_size=16)
    low = create_requests_with_priority(1, [1], [0.0], num_tokens=30, starting_idx=0)[0]
    scheduler.add_request(low)
    output = scheduler.schedule()
    assert len(output.scheduled_new_reqs) == 1
    assert len(scheduler.waiting) == 0 and len(scheduler.running) == 1
    scheduler.update_from_output(output, runner_output([low.request_id], [[100]]))

    high = create_requests_with_priority(1, [0], [1.0], num_tokens=32, starting_idx=1)[0]
    scheduler.add_request(high)
    output = scheduler.schedule()
    assert scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == 0
    assert len(output.scheduled_new_reqs) == 1
    assert output.scheduled_cached_reqs.num_reqs == 1
    assert len(scheduler.waiting) == 0 and len(scheduler.running) == 2
    ids = [low.request_id, high.request_id]
    scheduler.update_from_output(output, runner_output(ids, [[100], [100]]))

    output = scheduler.schedule()
    assert len(output.scheduled_new_reqs) == 0
    assert output.scheduled_cached_reqs.req_ids == [high.request_id]
    assert output.num_scheduled_tokens == {high.request_id: 1}
    assert output.total_num_scheduled_tokens == 1
    assert scheduler.requests[low.request_id].status == RequestStatus.PREEMPTED
    assert len(scheduler.waiting) == 1 and len(scheduler.running) == 1
    scheduler.update_from_output(output, runner_output(ids, [[], [100]]))
    scheduler.finish_requests(high.request_id, RequestStatus.FINISHED_STOPPED)

    output = scheduler.schedule()
    assert len(scheduler.waiting) == 0 and len(scheduler.running) == 1
    assert output.scheduled_cached_reqs.num_reqs == 0
    (new_req,) = output.scheduled_new_reqs
    assert new_req.req_id == low.request_id
    assert len(new_req.token_ids) == 32  # 30 prompt tokens + 2 decoded
    assert new_req.token_ids[31] == 100
    assert new_req.prompt_token_ids == [0] * 30


def test_priority_preemption_of_earlier_request_does_not_skip_later_ones():
    """test_priority_preemption_bug.py without DP throttling: running [A(9), B(0), C(1),
    D(2)]; A is scheduled first, C's block request preempts A (which sat before C), and
    D must still be scheduled. 8 usable blocks of 16: A 48+2 tokens = 4 blocks, B, C
    16+1 tokens = 1 block each, D 8+1 tokens = 1 block; step 3 needs 2 more."""
    scheduler = create_scheduler_with_priority(max_num_seqs=5, max_num_batched_tokens=200,
                                               num_blocks=9, block_size=16)
    a = create_requests_with_priority(1, [9], [1.0], num_tokens=48, req_ids=["A"])[0]
    scheduler.add_request(a)
    step(scheduler)
    b, c = create_requests_with_priority(2, [0, 1], [2.0, 3.0], num_tokens=16,
                                         req_ids=["B", "C"])
    d = create_requests_with_priority(1, [2], [4.0], num_tokens=8, req_ids=["D"])[0]
    for r in (b, c, d):
        scheduler.add_request(r)
    out, _ = step(scheduler)
    assert [r.request_id for r in scheduler.running] == ["A", "B", "C", "D"]
    out = scheduler.schedule()
    assert a.status == RequestStatus.PREEMPTED
    assert out.num_scheduled_tokens == {"B": 1, "C": 1, "D": 1}
    assert c.status == RequestStatus.RUNNING and d.status == RequestStatus.RUNNING


def test_fcfs_preemption_is_newest_first_and_recomputes():
    scheduler = create_scheduler(num_blocks=5, block_size=4, max_num_batched_tokens=64)
    old, new = create_requests(2, num_tokens=8, max_tokens=6, block_size=4,
                               req_ids=["old", "new"])
    scheduler.add_request(old)
    scheduler.add_request(new)
    step(scheduler)  # both prefilled: 2 blocks each, pool full
    out, _ = step(scheduler)  # both need a 3rd block: the newest is preempted
    assert out.preempted_req_ids == {"new"}
    assert new.status == RequestStatus.PREEMPTED and new.num_computed_tokens == 0
    assert list(scheduler.waiting) == [new]
    while scheduler.has_unfinished_requests():
        step(scheduler)
    assert scheduler.num_preemptions >= 1 and new.num_preemptions >= 1
    assert len(old.output_token_ids) == 6 and len(new.output_token_ids) == 6
    assert scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == 4


def test_preempted_request_resumes_with_prefix_cache_hit():
    """5 usable blocks of 4. old and new (8 tokens each) fill 4; old's 9th token takes the
    last one, new's needs a block: new (the newest) preempts itself, its 2 full blocks stay
    cached. old finishes (max_tokens 2), so new resumes with an 8-token hit."""
    scheduler = create_scheduler(num_blocks=6, block_size=4, max_num_batched_tokens=64,
                                 enable_prefix_caching=True)
    (old,) = create_requests(1, num_tokens=8, max_tokens=2, block_size=4, req_ids=["old"])
    (new,) = create_requests(1, num_tokens=8, max_tokens=6, block_size=4, req_ids=["new"],
                             starting_idx=1)
    scheduler.add_request(old)
    scheduler.add_request(new)
    step(scheduler)
    out, _ = step(scheduler)
    assert out.preempted_req_ids == {"new"} and old.is_finished()
    scheduler.make_stats()
    out, _ = step(scheduler)
    (resumed,) = out.scheduled_new_reqs
    assert resumed.req_id == "new" and resumed.num_computed_tokens == 8
    assert out.num_scheduled_tokens == {"new": 1}
    stats = scheduler.make_stats().prefix_cache_stats
    assert (stats.preempted_requests, stats.preempted_queries, stats.preempted_hits) == \
        (1, 9, 8)
    assert stats.requests == 0


def test_abort_at_any_point():
    """Abort a running, a preempted and a waiting request in one call."""
    scheduler = create_scheduler(num_blocks=5, block_size=4, max_num_batched_tokens=64)
    run, pre, wait = create_requests(3, num_tokens=8, max_tokens=6, block_size=4,
                                     req_ids=["run", "pre", "wait"])
    scheduler.add_request(run)
    scheduler.add_request(pre)
    step(scheduler)
    step(scheduler)  # 4 usable blocks: "run" needs a 3rd block, "pre" (newest) yields
    scheduler.add_request(wait)
    assert (run.status, pre.status, wait.status) == (
        RequestStatus.RUNNING, RequestStatus.PREEMPTED, RequestStatus.WAITING)
    done = scheduler.finish_requests(["run", "wait", "pre", "unknown"],
                                     RequestStatus.FINISHED_ABORTED)
    assert {q.request_id for q in done} == {"run", "wait", "pre"}
    assert all(q.get_finished_reason() == "abort" for q in done)
    assert scheduler.finish_requests("run", RequestStatus.FINISHED_ABORTED) == []
    out = scheduler.schedule()
    assert out.finished_req_ids == {"run", "wait", "pre"}
    assert out.num_scheduled_tokens == {}
    assert_scheduler_empty(scheduler)


def test_abort_after_schedule_drops_the_output():
    scheduler = create_scheduler()
    (req,) = create_requests(1)
    scheduler.add_request(req)
    out = scheduler.schedule()
    scheduler.finish_requests("0", RequestStatus.FINISHED_ABORTED)
    assert scheduler.update_from_output(out, runner_output(["0"], [[5]])) == []
    assert list(req.output_token_ids) == []


def test_finish_all_requests():
    scheduler = create_scheduler()
    for req in create_requests(4):
        scheduler.add_request(req)
    scheduler.schedule()
    assert len(scheduler.finish_requests(None, RequestStatus.FINISHED_ABORTED)) == 4
    scheduler.schedule()
    assert_scheduler_empty(scheduler)


def test_max_num_seqs_caps_running():
    scheduler = create_scheduler(max_num_seqs=3)
    for req in create_requests(5):
        scheduler.add_request(req)
    out = scheduler.schedule()
    assert _new_ids(out) == ["0", "1", "2"]
    assert len(scheduler.running) == 3 and len(scheduler.waiting) == 2
    scheduler.finish_requests("1", RequestStatus.FINISHED_ABORTED)
    scheduler.update_from_output(out, runner_output(["0", "2"], [[5], [5]]))
    out = scheduler.schedule()
    assert _new_ids(out) == ["3"] and out.finished_req_ids == {"1"}


def test_token_budget_chunks_prefill_and_admits_while_decoding():
    scheduler = create_scheduler(max_num_batched_tokens=8, max_num_seqs=8, block_size=4,
                                 max_model_len=64)
    (a,) = create_requests(1, num_tokens=12, req_ids=["a"], block_size=4)
    scheduler.add_request(a)
    out, _ = step(scheduler)
    assert out.num_scheduled_tokens == {"a": 8}
    (b,) = create_requests(1, num_tokens=3, req_ids=["b"], block_size=4)
    scheduler.add_request(b)
    out, res = step(scheduler)
    assert out.num_scheduled_tokens == {"a": 4, "b": 3}
    assert out.scheduled_cached_reqs.req_ids == ["a"]
    assert out.scheduled_cached_reqs.num_computed_tokens == [8]
    assert {r.request_id for r, _ in res} == {"a", "b"}


def test_prefix_hit_never_covers_the_last_token():
    scheduler = create_scheduler(enable_prefix_caching=True, block_size=4)
    first, second = create_requests(2, num_tokens=8, same_prompt=True, block_size=4,
                                    max_tokens=1)
    scheduler.add_request(first)
    step(scheduler)
    scheduler.add_request(second)
    out = scheduler.schedule()
    (new,) = out.scheduled_new_reqs
    assert new.num_computed_tokens == 4  # 2 cached blocks, the last recomputed
    assert out.num_scheduled_tokens == {"1": 4}
    assert second.num_cached_tokens == 4


def test_request_that_can_never_fit_fails_fast():
    scheduler = create_scheduler(num_blocks=5, block_size=4, max_model_len=64,
                                 max_num_batched_tokens=64)
    # 20 prompt tokens + 1 output: 20 KV slots (the last token is never fed) = 5 blocks
    (req,) = create_requests(1, num_tokens=20, max_tokens=1, block_size=4)
    with pytest.raises(OutOfResourcesError, match="needs 5 KV cache blocks"):
        scheduler.add_request(req)
    assert not scheduler.has_unfinished_requests()
    # prompt that fits but prompt + max_tokens never can
    (req,) = create_requests(1, num_tokens=12, max_tokens=8, block_size=4)
    with pytest.raises(OutOfResourcesError):
        scheduler.add_request(req)
    (req,) = create_requests(1, num_tokens=12, max_tokens=5, block_size=4)
    scheduler.add_request(req)  # 16 KV slots = 4 blocks: fits


@pytest.mark.parametrize("kwargs, match", [
    ({"scheduling_policy": "lifo"}, "Unknown scheduling policy: lifo"),
    ({"long_prefill_token_threshold": -1}, "long_prefill_token_threshold must be"),
    ({"watermark": 1.0}, "watermark must be"),
])
def test_config_validation(kwargs, match):
    with pytest.raises(InvalidArgumentError, match=match):
        EngineConfig(model="unused", **kwargs)


@pytest.mark.parametrize("kwargs, match", [
    ({"enable_chunked_prefill": False, "max_num_batched_tokens": 100, "max_model_len": 200},
     r"max_num_batched_tokens \(100\) is smaller than max_model_len \(200\)"),
    ({"max_num_batched_tokens": 8, "max_num_seqs": 16},
     r"max_num_batched_tokens \(8\) must be greater than or equal to max_num_seqs \(16\)"),
    ({"long_prefill_token_threshold": 300, "max_model_len": 200},
     r"long_prefill_token_threshold \(300\) cannot be greater than the max_model_len"),
])
def test_verify_max_model_len(kwargs, match):
    with pytest.raises(InvalidArgumentError, match=match):
        create_scheduler(**kwargs)


def test_make_stats():
    scheduler = create_scheduler(enable_prefix_caching=True, max_num_seqs=2, block_size=4,
                                 num_blocks=11, max_model_len=64, max_num_batched_tokens=64)
    for req in create_requests(3, num_tokens=9, same_prompt=True, block_size=4):
        scheduler.add_request(req)
    step(scheduler)
    stats = scheduler.make_stats()
    assert (stats.num_running_reqs, stats.num_waiting_reqs) == (2, 1)
    # the first request caches its 2 full blocks at allocation, so the second one hits
    # them in the same step: 3 + 1 blocks in use
    assert stats.kv_cache_usage == pytest.approx(4 / 10)
    assert (stats.prefix_cache_stats.requests, stats.prefix_cache_stats.queries,
            stats.prefix_cache_stats.hits) == (2, 18, 8)
    assert scheduler.make_stats().prefix_cache_stats.requests == 0  # swapped per call
    scheduler.finish_requests("0", RequestStatus.FINISHED_ABORTED)
    step(scheduler)
    stats = scheduler.make_stats()
    assert (stats.prefix_cache_stats.requests, stats.prefix_cache_stats.hits) == (1, 8)
    assert create_scheduler(log_stats=False).make_stats() is None


def test_stats_aggregator_accumulates_counters():
    scheduler = create_scheduler(enable_prefix_caching=True, block_size=4, num_blocks=5,
                                 max_model_len=64, max_num_batched_tokens=64)
    agg = StatsAggregator()
    for req in create_requests(2, num_tokens=8, max_tokens=6, block_size=4,
                               same_prompt=False):
        scheduler.add_request(req)
    while scheduler.has_unfinished_requests():
        step(scheduler)
        agg.observe(scheduler.make_stats(), scheduler.num_preemptions)
    s = agg.stats
    assert s.num_preemptions == scheduler.num_preemptions >= 1
    assert s.prefix_cache_queries == 16  # preempted re-lookups are counted apart
    assert s.num_running_reqs == 0 and s.num_waiting_reqs == 0 and s.kv_cache_usage == 0.0


def _check_valid_scheduler_output(so: SchedulerOutput, seen: set[str], scheduler: Scheduler,
                                  budget: int) -> None:
    new_ids = {r.req_id for r in so.scheduled_new_reqs}
    for req in so.scheduled_new_reqs:
        assert req.req_id not in seen or scheduler.requests[req.req_id].num_preemptions
        seen.add(req.req_id)
    assert set(so.scheduled_cached_reqs.req_ids) <= seen
    assert set(so.num_scheduled_tokens) == new_ids | set(so.scheduled_cached_reqs.req_ids)
    assert sum(so.num_scheduled_tokens.values()) == so.total_num_scheduled_tokens <= budget
    assert so.finished_req_ids <= seen
    assert len(scheduler.running) <= scheduler.max_num_running_reqs
    pool = scheduler.kv_cache_manager.block_pool
    held = {b.block_id for bl in scheduler.kv_cache_manager.single_type_manager
            .req_to_blocks.values() for b in bl}
    assert len(held) + pool.get_num_free_blocks() == pool.num_gpu_blocks - 1
    for block in pool.blocks[1:]:
        assert block.ref_cnt >= 0


@pytest.mark.parametrize("enable_prefix_caching", [True, False])
@pytest.mark.parametrize("policy", ["priority", "fcfs"])
@pytest.mark.parametrize("max_input, max_output, max_num_seqs, num_blocks", [
    (300, 40, 64, 1000),  # standard
    (60, 200, 64, 30),  # generation heavy, few blocks: many preemptions
], ids=["standard", "preemption"])
def test_scheduling_blast(enable_prefix_caching, policy, max_input, max_output,
                          max_num_seqs, num_blocks):
    """test_priority_scheduler_random.py, reduced (300 steps, text only), both policies."""
    rng = random.Random(42)
    budget = 512
    scheduler = create_scheduler(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                                 enable_prefix_caching=enable_prefix_caching,
                                 num_blocks=num_blocks, block_size=16, max_model_len=512,
                                 scheduling_policy=policy)
    counter = iter(range(10**6))

    def add_random():
        n = rng.randint(1, max_input)
        req = Request(f"r{next(counter)}", rng.choices(range(50), k=n),
                      SamplingParams(max_tokens=rng.randint(1, max_output)), EOS_TOKEN_ID,
                      rng.uniform(0, 1), 16, priority=rng.randint(-3, 3))
        scheduler.add_request(req)

    for _ in range(12):
        add_random()
    seen: set[str] = set()
    finished = 0
    for _ in range(300):
        if len(scheduler.waiting) == 0:
            for _ in range(rng.randint(0, 2)):
                add_random()
        so = scheduler.schedule()
        _check_valid_scheduler_output(so, seen, scheduler, budget)
        results = scheduler.update_from_output(so, mock_output(scheduler, so,
                                                               rng.randint(0, 99)))
        finished += sum(r.is_finished() for r, _ in results)
    assert finished > 0
    scheduler.finish_requests(None, RequestStatus.FINISHED_ABORTED)
    scheduler.schedule()
    assert_scheduler_empty(scheduler)
