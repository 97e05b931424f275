"""The hybrid block pool on the scheduler's side: KVCacheManager with MambaManagers
(mamba_cache_mode "none": one state block per running request and GDN group, from the
same pool as the KV blocks) and the Scheduler over it (no model).

Mirrors vLLM 0.33 tests/v1/core/test_prefix_caching.py (test_prefill_hybrid_model: the
groups draw from one pool, blocks numbered across groups) and
tests/v1/core/test_single_type_kv_cache_manager.py (MambaManager: one block a request,
freed with it), re-expressed for our API. The block arithmetic of each case is in its
comments (block 0 is the null block; 16-token blocks; 3 GDN groups).
"""

from __future__ import annotations

import pytest
from test_scheduler import create_requests, mock_output

from libvllm.engine.config import EngineConfig
from libvllm.engine.core.kv_cache_manager import KVCacheManager
from libvllm.engine.core.kv_cache_utils import get_num_kv_blocks
from libvllm.engine.core.scheduler import Scheduler
from libvllm.engine.errors import OutOfResourcesError
from libvllm.engine.request import RequestStatus
from libvllm.engine.resolved_config import SchedulerConfig

GROUPS = 3


def _scheduler(num_blocks: int, max_num_seqs: int = 1024, max_model_len: int = 256,
               max_num_batched_tokens: int = 8192) -> Scheduler:
    config = EngineConfig(model="unused", max_num_seqs=max_num_seqs,
                          max_num_batched_tokens=max_num_batched_tokens,
                          enable_prefix_caching=False)
    kv = KVCacheManager(num_blocks, 16, max_model_len, False, num_mamba_groups=GROUPS)
    return Scheduler(SchedulerConfig.from_engine_config(
        config, max_model_len, max_num_seqs, max_num_batched_tokens, False), kv)


def test_state_blocks_come_from_the_pool():
    """A new request takes its KV blocks and one block per GDN group, all distinct ids of
    the one pool; the runner hears of them in NewRequestData.state_block_ids."""
    kv = KVCacheManager(20, 16, 256, False, num_mamba_groups=GROUPS)
    (req,) = create_requests(1, num_tokens=40)
    assert kv.allocate_slots(req, 40) is not None
    ids = kv.get_block_ids("0") + kv.get_state_block_ids("0")
    assert len(ids) == 3 + GROUPS and len(set(ids)) == 6 and 0 not in ids
    assert kv.block_pool.get_num_free_blocks() == 20 - 1 - 6
    # growing the request takes KV blocks only
    req.num_computed_tokens = 40
    assert len(kv.allocate_slots(req, 16).blocks) == 1
    assert kv.block_pool.get_num_free_blocks() == 20 - 1 - 7
    kv.free(req)
    assert kv.block_pool.get_num_free_blocks() == 19
    assert all(not m.req_to_block for m in kv.mamba_managers)


def test_admission_counts_state_blocks():
    """13 usable blocks; each 10-token request needs 1 KV + 3 state blocks: 3 fit (12),
    the 4th waits although max_num_seqs would seat it; the pool decides."""
    sched = _scheduler(14)
    for r in create_requests(4, num_tokens=10):
        sched.add_request(r)
    out = sched.schedule()
    assert [n.req_id for n in out.scheduled_new_reqs] == ["0", "1", "2"]
    assert all(len(n.state_block_ids) == GROUPS for n in out.scheduled_new_reqs)
    assert len(sched.waiting) == 1
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 1


def test_full_pool_preempts_instead_of_failing():
    """9 usable blocks: two 16-token requests take 1 KV + 3 state blocks each (8). Their
    decode steps need a second KV block each: the newest is preempted (recompute), its
    4 blocks go back, and the first one grows."""
    sched = _scheduler(10)
    reqs = create_requests(2, num_tokens=16, max_tokens=8)
    for r in reqs:
        sched.add_request(r)
    out = sched.schedule()
    assert len(out.scheduled_new_reqs) == 2
    sched.update_from_output(out, mock_output(sched, out))
    out = sched.schedule()
    assert sched.num_preemptions == 1 and reqs[1].status == RequestStatus.PREEMPTED
    assert out.preempted_req_ids == {"1"} and list(out.num_scheduled_tokens) == ["0"]
    mamba = sched.kv_cache_manager.mamba_managers
    assert all("1" not in m.req_to_block for m in mamba)
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 9 - 5


def test_state_blocks_freed_on_finish_and_abort_and_reused():
    sched = _scheduler(20)
    a, b = create_requests(2, num_tokens=10, max_tokens=1)
    sched.add_request(a)
    sched.add_request(b)
    out = sched.schedule()  # blocks 1-8: 1 KV + 3 state blocks each
    runner_out = mock_output(sched, out)  # each samples its only token
    sched.finish_requests("1", RequestStatus.FINISHED_ABORTED)  # abort
    sched.update_from_output(out, runner_out)  # request 0 finishes
    pool = sched.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == 19
    assert all(not m.req_to_block for m in sched.kv_cache_manager.mamba_managers)
    (c,) = create_requests(1, num_tokens=10, starting_idx=5)
    sched.add_request(c)
    (new,) = sched.schedule().scheduled_new_reqs
    # freed blocks without a hash go to the head of the free queue: they are reused
    assert set(new.block_ids + new.state_block_ids) <= set(range(1, 9))


def test_request_that_cannot_fit_with_its_state_is_refused():
    """5 usable blocks: a 64-token request needs 4 KV blocks, plus 3 state blocks: 7."""
    sched = _scheduler(6)
    (req,) = create_requests(1, num_tokens=64, max_tokens=1)
    with pytest.raises(OutOfResourcesError, match="needs 4 KV cache blocks .* has 2 blocks"):
        sched.add_request(req)


def test_start_up_needs_one_full_request_with_its_states():
    """vLLM's _check_enough_kv_cache_memory with the state blocks: max_model_len 256 in
    16-token blocks is 16 KV blocks, + 3 state blocks + the null block = 20."""
    assert get_num_kv_blocks(20 * 100, 100, 16, 256, state_blocks=GROUPS) == 20
    with pytest.raises(OutOfResourcesError, match="max seq len"):
        get_num_kv_blocks(19 * 100, 100, 16, 256, state_blocks=GROUPS)
