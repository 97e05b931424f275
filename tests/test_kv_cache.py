"""KV cache manager, block pool and scheduler units (no model needed).

Mirrors upstream vLLM 0.33 tests/v1/core/test_kv_cache_utils.py
(test_free_kv_cache_block_queue_operations) and tests/v1/core/test_prefix_caching.py
(prefill hit / eviction order) and tests/v1/core/test_scheduler.py (token budget,
preemption), re-expressed for our single-group manager. Full ports: issue 4.
"""

from __future__ import annotations

import pytest

from engine.config import EngineConfig
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.kv_cache_utils import FreeKVCacheBlockQueue, KVCacheBlock
from engine.core.sched_output import ModelRunnerOutput
from engine.core.scheduler import Scheduler
from engine.request import Request, RequestStatus
from engine.sampling_params import SamplingParams

BS = 4


def make_request(rid: str, ids: list[int], max_tokens: int = 8) -> Request:
    return Request(rid, ids, SamplingParams(temperature=0.0, max_tokens=max_tokens),
                   eos_token_id=None, arrival_time=0.0, block_size=BS)


def test_free_kv_cache_block_queue_operations():
    blocks = [KVCacheBlock(i) for i in range(5)]
    queue = FreeKVCacheBlockQueue(blocks)
    assert queue.num_free_blocks == 5
    assert queue.popleft() is blocks[0]
    queue.remove(blocks[2])
    assert blocks[1].next_free_block is blocks[3] and blocks[3].prev_free_block is blocks[1]
    queue.append(blocks[2])
    assert queue.fake_free_list_tail.prev_free_block is blocks[2]
    assert blocks[2].prev_free_block is blocks[4]
    assert [b.block_id for b in queue.get_all_free_blocks()] == [1, 3, 4, 2]
    for _ in range(4):
        queue.popleft()
    assert queue.fake_free_list_head.next_free_block is queue.fake_free_list_tail
    with pytest.raises(ValueError, match="No free blocks available"):
        queue.popleft()


def test_prefill_prefix_hit_and_refcounts():
    mgr = KVCacheManager(num_blocks=11, block_size=BS, max_model_len=64, enable_caching=True)
    common = list(range(100, 108))  # two full blocks
    r0 = make_request("0", common + [1, 2, 3])
    hits, n = mgr.get_computed_blocks(r0)
    assert (hits, n) == ([], 0)
    assert len(mgr.allocate_slots(r0, r0.num_tokens)) == 3
    r1 = make_request("1", common + [7])
    hits, n = mgr.get_computed_blocks(r1)
    assert n == 8 and [b.block_id for b in hits] == mgr.get_block_ids("0")[:2]
    mgr.allocate_slots(r1, 1, hits)
    assert [b.ref_cnt for b in hits] == [2, 2]
    b0, b1, b2 = mgr.get_block_ids("0")
    b3 = mgr.get_block_ids("1")[2]
    mgr.free(r0)  # b0, b1 still held by r1: only b2 is freed
    mgr.free(r1)  # freed tail-first: b3, b1, b0
    free_ids = [b.block_id for b in mgr.block_pool.free_block_queue.get_all_free_blocks()]
    assert free_ids[-4:] == [b2, b3, b1, b0]
    # freed blocks stay cached until evicted
    r2 = make_request("2", common + [9, 9])
    assert mgr.get_computed_blocks(r2)[1] == 8


def test_hit_never_covers_the_last_token():
    mgr = KVCacheManager(num_blocks=11, block_size=BS, max_model_len=64, enable_caching=True)
    r0 = make_request("0", list(range(8)))
    mgr.allocate_slots(r0, 8)
    assert mgr.get_computed_blocks(make_request("1", list(range(8))))[1] == 4


def _scheduler(num_blocks: int, budget: int) -> Scheduler:
    cfg = EngineConfig(model="x", max_num_batched_tokens=budget, max_num_seqs=8)
    return Scheduler(cfg, KVCacheManager(num_blocks, BS, 64, True), max_model_len=64)


def _step(sched: Scheduler):
    so = sched.schedule()
    req_ids = list(so.num_scheduled_tokens)
    sampled = [[5] if sched.requests[r].num_computed_tokens == sched.requests[r].num_tokens
                else [] for r in req_ids]
    return so, sched.update_from_output(so, ModelRunnerOutput(req_ids, sampled))


def test_token_budget_chunks_prefill_and_admits_while_decoding():
    sched = _scheduler(num_blocks=64, budget=8)
    sched.add_request(make_request("a", list(range(12))))
    so, _ = _step(sched)
    assert so.num_scheduled_tokens == {"a": 8}  # first chunk
    sched.add_request(make_request("b", list(range(50, 53))))
    so, res = _step(sched)
    assert so.num_scheduled_tokens == {"a": 4, "b": 3}  # rest of a + all of b together
    assert {r.request_id for r, _ in res} == {"a", "b"}


def test_preemption_is_newest_first_and_recomputes():
    sched = _scheduler(num_blocks=5, budget=64)  # 4 usable blocks
    sched.add_request(make_request("old", list(range(8)), max_tokens=6))
    sched.add_request(make_request("new", list(range(20, 28)), max_tokens=6))
    _step(sched)  # both prefilled: 2 blocks each
    so, _ = _step(sched)  # both need a 3rd block: the newest is preempted
    assert so.preempted_req_ids == {"new"}
    assert sched.requests["new"].status == RequestStatus.PREEMPTED
    while sched.has_unfinished_requests():
        _step(sched)
    assert sched.num_preemptions >= 1
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 4
