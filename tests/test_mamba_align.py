"""engine/core/mamba_align.py: vLLM's mamba_cache_mode "align" bookkeeping on the shared
block pool (block-aligned prefill chunks, states saved at block boundaries into pool
blocks cached under (block hash, group id), hits trimmed to a saved state, LRU eviction).
Mirrors vLLM 0.33 tests/v1/core/test_mamba_align_chunk_split.py and test_prefix_caching.py
(test_prefill_hybrid_model_mamba_align, BlockHashWithGroupId keys) in spirit; the
engine-level hits and tokens are in test_hybrid_gdn_engine.py.
"""

from __future__ import annotations

from libvllm.engine.core.block_pool import BlockPool
from libvllm.engine.core.mamba_align import MambaAlignCache, make_block_hash_with_group_id
from libvllm.engine.request import Request
from libvllm.engine.sampling_params import SamplingParams


def _req(n: int, rid: str = "r", first: int = 0) -> Request:
    return Request(rid, list(range(first, first + n)), SamplingParams(max_tokens=4),
                   eos_token_id=None, arrival_time=0.0, block_size=4)


def _cache(num_blocks: int = 16, groups: int = 2) -> MambaAlignCache:
    return MambaAlignCache(BlockPool(num_blocks, enable_caching=True), 4, groups)


def test_prefill_chunks_end_on_block_boundaries():
    c = _cache()
    assert c.align_num_new(0, 10) == 8  # the last boundary inside the chunk
    assert c.align_num_new(8, 2) == 2  # no boundary inside: unchanged
    assert c.align_num_new(6, 5) == 2  # ends at 8
    assert c.align_num_new(7, 1) == 1  # decode steps are never split


def test_save_then_hit_trimmed_to_saved_state():
    c = _cache()
    pool = c.block_pool
    r = _req(13)
    saved = c.plan_save(r, 8)  # state after block 2: one block per group
    assert saved == [1, 2] and pool.get_num_free_blocks() == 15 - 2
    assert c.plan_save(r, 6) is None  # not on a boundary
    twin = _req(13, "t")
    assert c.trim_hit(twin, 3) == (0, None)  # not cached until the copies are issued
    c.release_pending()  # the next schedule(): cached (ref 0, evictable)
    assert pool.get_num_free_blocks() == 15
    key = make_block_hash_with_group_id(r.block_hashes[1], 2)
    assert key == r.block_hashes[1] + b"\x00\x00\x00\x02"
    assert pool.get_cached_block(key).block_id == 2
    assert c.plan_save(r, 8) is None  # already kept
    assert c.trim_hit(twin, 3) == (2, [1, 2])  # 3 attention blocks hit, state after 2
    assert pool.get_num_free_blocks() == 13  # held for the restore copy
    c.release_pending()
    assert pool.get_num_free_blocks() == 15
    assert c.trim_hit(_req(3, "u"), 0) == (0, None)


def test_eviction_of_one_group_loses_the_state():
    c = _cache(num_blocks=5)  # 4 usable blocks
    r = _req(9)
    assert c.plan_save(r, 4) == [1, 2]
    c.release_pending()
    # uncached blocks 3, 4 are taken first; the next pop evicts the LRU cached block 1
    assert [b.block_id for b in c.block_pool.get_new_blocks(3)] == [3, 4, 1]
    assert c.trim_hit(_req(9, "t"), 2) == (0, None)


def test_decode_saves_evict_no_cached_block():
    c = _cache(num_blocks=7)  # 6 usable blocks
    a, b, d = _req(9, "a", 0), _req(9, "b", 100), _req(9, "d", 200)
    assert c.plan_save(a, 4) == [1, 2] and c.plan_save(b, 4) == [3, 4]
    c.release_pending()
    d.num_computed_tokens = 3
    assert c.plan_save(d, 1) == [5, 6]  # a decode step: uncached blocks are free
    c.release_pending()
    e = _req(9, "e", 300)
    e.num_computed_tokens = 3
    assert c.plan_save(e, 1) is None  # only cached blocks left: nothing evicted
    e.num_computed_tokens = 0
    assert c.plan_save(e, 4) == [1, 2]  # a prefill step evicts the oldest (a's)
    c.release_pending()
    assert c.trim_hit(_req(9, "a2", 0), 2) == (0, None)
    assert c.trim_hit(_req(9, "b2", 100), 2) == (1, [3, 4])
    c.release_pending()
    assert c.block_pool.reset_prefix_cache()
    assert c.trim_hit(_req(9, "b3", 100), 2) == (0, None)
