"""engine/core/mamba_align.py: vLLM's mamba_cache_mode "align" bookkeeping (block-aligned
prefill chunks, states saved at block boundaries, hits trimmed to a saved state, LRU
snapshot recycling). Mirrors vLLM 0.33 tests/v1/core/test_mamba_align_chunk_split.py and
test_prefix_caching.py (test_prefill_hybrid_model_mamba_align) in spirit; the engine-level
hits and tokens are in test_hybrid_gdn_engine.py.
"""

from __future__ import annotations

from engine.core.mamba_align import MambaAlignCache
from engine.request import Request
from engine.sampling_params import SamplingParams


def _req(n: int, rid: str = "r", first: int = 0) -> Request:
    return Request(rid, list(range(first, first + n)), SamplingParams(max_tokens=4),
                   eos_token_id=None, arrival_time=0.0, block_size=4)


def test_prefill_chunks_end_on_block_boundaries():
    c = MambaAlignCache(block_size=4, first_slot=3, num_slots=2)
    assert c.align_num_new(0, 10) == 8  # the last boundary inside the chunk
    assert c.align_num_new(8, 2) == 2  # no boundary inside: unchanged
    assert c.align_num_new(6, 5) == 2  # ends at 8
    assert c.align_num_new(7, 1) == 1  # decode steps are never split


def test_save_then_hit_trimmed_to_saved_state():
    c = MambaAlignCache(block_size=4, first_slot=3, num_slots=2)
    r = _req(13)
    assert c.plan_save(r, 8) == 3  # state after block 2 -> slot 3
    assert c.plan_save(r, 6) is None  # not on a boundary
    assert c.plan_save(r, 8) is None  # already kept
    twin = _req(13, "t")
    assert c.trim_hit(twin, 3) == (2, 3)  # 3 attention blocks hit, state after 2 only
    assert c.trim_hit(_req(3, "u"), 0) == (0, None)


def test_lru_recycling_and_decode_saves_only_take_free_slots():
    c = MambaAlignCache(block_size=4, first_slot=3, num_slots=2)
    a, b, d = _req(9, "a", 0), _req(9, "b", 100), _req(9, "d", 200)
    assert c.plan_save(a, 4) == 3 and c.plan_save(b, 4) == 4
    d.num_computed_tokens = 3
    assert c.plan_save(d, 1) is None  # a decode step: no free slot, nothing evicted
    d.num_computed_tokens = 0
    assert c.plan_save(d, 4) == 3  # a prefill step recycles the oldest (a's)
    assert c.trim_hit(_req(9, "a2", 0), 2) == (0, None)
    assert c.trim_hit(_req(9, "b2", 100), 2) == (1, 4)
    c.reset()
    assert c.trim_hit(_req(9, "b3", 100), 2) == (0, None) and len(c.free_slots) == 2
