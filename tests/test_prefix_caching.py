"""Prefix caching in the KV cache manager and block pool.

Mirrors vLLM 0.33 tests/v1/core/test_prefix_caching.py, re-expressed for our
single-group API (`get_computed_blocks` -> (KVCacheBlocks, num_tokens), block ids as one
list, hash keys without a group id). Oracle: the upstream expectations (block ids,
free-queue order, ref counts). Hybrid/Mamba/sliding-window/EAGLE/HiSparse/multimodal/
LoRA/KV-event cases are skipped: this engine has one full-attention group and none of
those inputs.
"""

from __future__ import annotations

import pytest

from libvllm.engine.core import kv_cache_utils
from libvllm.engine.core.block_pool import BlockHashToBlockMap, BlockPool
from libvllm.engine.core.kv_cache_manager import KVCacheManager
from libvllm.engine.core.kv_cache_utils import KVCacheBlock, hash_block_tokens
from libvllm.engine.request import Request
from libvllm.engine.sampling_params import SamplingParams

NOT_HERE = "one full-attention KV group and no multimodal/LoRA/KV events here (not built)"


def make_request(request_id: str, prompt_token_ids: list[int], block_size: int,
                 cache_salt: str | None = None, prompt_logprobs: int | None = None
                 ) -> Request:
    sp = SamplingParams(max_tokens=17, prompt_logprobs=prompt_logprobs)
    return Request(request_id, prompt_token_ids, sp, eos_token_id=100, arrival_time=0.0,
                   block_size=block_size, cache_salt=cache_salt)


def make_kv_cache_manager(block_size: int, num_blocks: int, enable_caching: bool = True,
                          log_stats: bool = True) -> KVCacheManager:
    return KVCacheManager(num_blocks, block_size, max_model_len=8192,
                          enable_caching=enable_caching, log_stats=log_stats)


def free_ids(manager: KVCacheManager) -> list[int]:
    return [b.block_id for b in manager.block_pool.free_block_queue.get_all_free_blocks()]


def req_blocks(manager: KVCacheManager, request_id: str) -> list[KVCacheBlock]:
    return manager.single_type_manager.req_to_blocks[request_id]


def test_prefill():
    block_size = 16
    manager = make_kv_cache_manager(block_size, 11)
    common_token_ids = [i for i in range(3) for _ in range(16)]  # 3 full blocks

    # Fully cache miss; incomplete 4th block (7 tokens)
    all_token_ids = common_token_ids + [3] * 7
    req0 = make_request("0", all_token_ids, block_size)
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req0)
    assert len(req0.block_hashes) == 3
    assert not computed_blocks.blocks
    assert num_computed_tokens == 0
    blocks = manager.allocate_slots(req0, 55, len(computed_blocks.blocks) * 16,
                                    computed_blocks)
    assert blocks is not None and blocks.get_block_ids() == [1, 2, 3, 4]

    # full blocks are cached under the chained hash
    parent_block_hash = None
    for block_id in (1, 2, 3):
        block_tokens = tuple(all_token_ids[(block_id - 1) * 16:block_id * 16])
        block_hash = hash_block_tokens(parent_block_hash, block_tokens)
        assert manager.block_pool.blocks[block_id].block_hash == block_hash
        assert manager.block_pool.blocks[block_id].ref_cnt == 1
        parent_block_hash = block_hash
    assert manager.block_pool.blocks[4].block_hash is None
    assert manager.block_pool.blocks[4].ref_cnt == 1

    # hit in the common prefix while the original blocks are in use
    req1 = make_request("1", common_token_ids + [3] * 5, block_size)
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req1)
    assert len(req1.block_hashes) == 3
    assert computed_blocks.get_block_ids() == [1, 2, 3]
    assert num_computed_tokens == 3 * 16
    blocks = manager.allocate_slots(req1, 53 - 3 * 16, len(computed_blocks.blocks) * 16,
                                    computed_blocks)
    assert blocks is not None and blocks.get_block_ids() == [5]
    for block in computed_blocks.blocks:
        assert block.ref_cnt == 2
    free_block_queue = manager.block_pool.free_block_queue
    assert free_block_queue.num_free_blocks == 5

    manager.free(req0)
    manager.free(req1)
    assert free_block_queue.num_free_blocks == 10
    # [unhashed partial blocks 5, 4 prepended] [never used 6..10] [common 3, 2, 1 (LRU)]
    assert free_ids(manager) == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]

    # hit in the common prefix when the original blocks are already free
    req2 = make_request("2", common_token_ids + [3] * 6, block_size)
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req2)
    assert computed_blocks.get_block_ids() == [1, 2, 3]
    assert num_computed_tokens == 3 * 16
    blocks = manager.allocate_slots(req2, 53 - 3 * 16, len(computed_blocks.blocks) * 16,
                                    computed_blocks)
    assert blocks is not None and blocks.get_block_ids() == [5]  # reuses partial 5
    assert free_block_queue.num_free_blocks == 6
    assert all(b.ref_cnt == 0 for b in free_block_queue.get_all_free_blocks())
    assert len(free_block_queue.get_all_free_blocks()) == 6
    manager.free(req2)

    # cache miss and eviction; the block order is the eviction order
    req3 = make_request("3", [99] * (16 * 10), block_size)
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req3)
    assert not computed_blocks.blocks and num_computed_tokens == 0
    blocks = manager.allocate_slots(req3, 16 * 10, 0, computed_blocks)
    assert blocks is not None and blocks.get_block_ids() == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]
    assert free_block_queue.num_free_blocks == 0
    assert free_block_queue.fake_free_list_head.next_free_block is \
        free_block_queue.fake_free_list_tail
    assert free_block_queue.fake_free_list_tail.prev_free_block is \
        free_block_queue.fake_free_list_head


def test_prefill_plp():
    """Prompt-logprobs requests never read the cache but still fill it."""
    block_size = 16
    manager = make_kv_cache_manager(block_size, 11)
    common_token_ids = [i for i in range(3) for _ in range(16)]

    req0 = make_request("0", common_token_ids + [3] * 7, block_size,
                        prompt_logprobs=5)
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req0)
    assert len(req0.block_hashes) == 3
    assert not computed_blocks.blocks and num_computed_tokens == 0
    blocks = manager.allocate_slots(req0, 55, 0, computed_blocks)
    assert blocks is not None and blocks.get_block_ids() == [1, 2, 3, 4]
    req0_block_hashes = [b.block_hash for b in blocks.blocks]

    # a normal request hits req0's blocks
    req1 = make_request("1", common_token_ids + [3] * 5, block_size)
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req1)
    assert computed_blocks.get_block_ids() == [1, 2, 3]
    assert num_computed_tokens == 3 * 16
    blocks = manager.allocate_slots(req1, 5, 48, computed_blocks)
    assert blocks is not None and blocks.get_block_ids() == [5]
    for block in computed_blocks.blocks:
        assert block.ref_cnt == 2
    assert manager.block_pool.free_block_queue.num_free_blocks == 5
    manager.free(req0)
    manager.free(req1)
    assert manager.block_pool.free_block_queue.num_free_blocks == 10
    assert free_ids(manager) == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]

    # another plp request: no hit; duplicates req0's cached blocks (same hashes)
    req2 = make_request("2", common_token_ids + [3] * 6, block_size,
                        prompt_logprobs=5)
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req2)
    assert len(req2.block_hashes) == 3
    assert not computed_blocks.blocks and num_computed_tokens == 0
    blocks = manager.allocate_slots(req2, 55, 0, computed_blocks)
    assert blocks is not None
    assert [b.block_hash for b in blocks.blocks] == req0_block_hashes
    assert blocks.get_block_ids() != [1, 2, 3, 4]
    for block_id in blocks.get_block_ids():
        assert manager.block_pool.blocks[block_id].ref_cnt == 1
    manager.free(req2)


def test_decode():
    block_size = 16
    manager = make_kv_cache_manager(block_size, 11)
    common_token_ids = [i for i in range(3) for _ in range(16)]
    req0 = make_request("0", common_token_ids + [3] * 7, block_size)
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req0)
    assert not computed_blocks.blocks and num_computed_tokens == 0
    blocks = manager.allocate_slots(req0, 55, 0, computed_blocks)
    assert blocks is not None and blocks.get_block_ids() == [1, 2, 3, 4]

    # append slots without a new block
    req0.num_computed_tokens = 55
    for _ in range(4):
        req0.append_output_token_ids(8)
    new_blocks = manager.allocate_slots(req0, 4)
    assert new_blocks is not None and len(new_blocks.blocks) == 0
    assert req_blocks(manager, "0")[-1].block_hash is None

    # append slots with a new block: 9 tokens fill the 4th block, 10 go to a 5th
    req0.num_computed_tokens = 59
    for _ in range(9 + 10):
        req0.append_output_token_ids(7)
    new_blocks = manager.allocate_slots(req0, 19)
    assert new_blocks is not None and len(new_blocks.blocks) == 1
    assert req_blocks(manager, "0")[-2].block_hash is not None
    assert req_blocks(manager, "0")[-1].block_hash is None


def test_evict():
    block_size = 16
    manager = make_kv_cache_manager(block_size, 11)
    last_token_id = 5 * 16 + 7
    req0 = make_request("0", list(range(last_token_id)), block_size)
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req0)
    assert not computed_blocks.blocks and num_computed_tokens == 0
    blocks = manager.allocate_slots(req0, 5 * 16 + 7, 0, computed_blocks)
    assert blocks is not None and len(blocks.blocks) == 6  # 5 full + 1 partial

    req1 = make_request("1", list(range(last_token_id, last_token_id + 3 * 16)), block_size)
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req1)
    assert not computed_blocks.blocks and num_computed_tokens == 0
    blocks = manager.allocate_slots(req1, 3 * 16, 0, computed_blocks)
    assert blocks is not None and len(blocks.blocks) == 3
    assert manager.block_pool.free_block_queue.num_free_blocks == 1

    manager.free(req0)
    # the partial block (no hash) goes to the head, the others tail-first (LRU)
    assert free_ids(manager) == [6, 10, 5, 4, 3, 2, 1]
    manager.free(req1)
    assert manager.block_pool.free_block_queue.num_free_blocks == 10
    assert free_ids(manager) == [6, 10, 5, 4, 3, 2, 1, 9, 8, 7]

    # touch the first 2 blocks
    req2 = make_request("2", list(range(2 * 16 + 3)), block_size)
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req2)
    assert computed_blocks.get_block_ids() == [1, 2]
    assert num_computed_tokens == 2 * 16
    blocks = manager.allocate_slots(req2, 3, 32, computed_blocks)
    assert blocks is not None and blocks.get_block_ids() == [6]
    assert manager.block_pool.free_block_queue.num_free_blocks == 7


def test_hash_block_correct_reuse():
    """A cached block reused as a new block loses its hash."""
    block_size = 16
    manager = make_kv_cache_manager(block_size, 2)
    req = make_request("0", list(range(block_size)), block_size)
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req)
    assert not computed_blocks.blocks and num_computed_tokens == 0
    blocks = manager.allocate_slots(req, block_size, 0, computed_blocks)
    assert blocks is not None and len(blocks.blocks) == 1
    manager.free(req)

    req = make_request("1", list(range(block_size - 1)), block_size)
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req)
    assert not computed_blocks.blocks and num_computed_tokens == 0
    blocks = manager.allocate_slots(req, block_size - 1, 0, computed_blocks)
    assert blocks is not None and len(blocks.blocks) == 1
    assert manager.block_pool.blocks[blocks.blocks[0].block_id].block_hash is None
    assert not manager.block_pool.cached_block_hash_to_block


def test_computed_blocks_not_evicted():
    """Allocating for a hit evicts other free blocks, never the hit itself."""
    block_size = 16
    manager = make_kv_cache_manager(block_size, 3)
    req0 = make_request("0", list(range(block_size)), block_size)
    blocks = manager.allocate_slots(req0, block_size)
    assert blocks is not None and blocks.get_block_ids() == [1]
    req1 = make_request("1", list(range(block_size, block_size * 2)), block_size)
    blocks = manager.allocate_slots(req1, block_size)
    assert blocks is not None and blocks.get_block_ids() == [2]
    manager.free(req0)
    manager.free(req1)

    req2 = make_request("2", list(range(block_size * 2)), block_size)
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req2)
    assert computed_blocks.get_block_ids() == [1]
    assert num_computed_tokens == block_size
    blocks = manager.allocate_slots(req2, block_size, block_size, computed_blocks)
    assert blocks is not None and blocks.get_block_ids() == [2]


def test_basic_prefix_caching_disabled():
    block_size = 4
    manager = make_kv_cache_manager(block_size, 5, enable_caching=False)
    req1 = make_request("1", list(range(10)), block_size)
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req1)
    assert not computed_blocks.blocks and num_computed_tokens == 0
    blocks = manager.allocate_slots(req1, 10, 0, computed_blocks)
    assert blocks is not None and len(blocks.blocks) == 3
    manager.free(req1)

    req2 = make_request("2", list(range(16)), block_size)  # shared prefix, no caching
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req2)
    assert not computed_blocks.blocks and num_computed_tokens == 0
    blocks = manager.allocate_slots(req2, 16, 0, computed_blocks)
    assert blocks is not None and len(blocks.blocks) == 4

    req3 = make_request("3", list(range(4)), block_size)
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req3)
    assert not computed_blocks.blocks and num_computed_tokens == 0
    assert manager.allocate_slots(req3, 4, 0, computed_blocks) is None
    assert all(b.block_hash is None for b in manager.block_pool.blocks)


def test_cache_blocks():
    block_size = 4
    block_pool = BlockPool(num_gpu_blocks=5, enable_caching=True)
    # blocks [0,1,2,3] [4,5,6,7] [8,9,10,11] [12,13]
    req = make_request("0", list(range(14)), block_size)
    blocks = [KVCacheBlock(block_id=i) for i in range(2)]
    block_pool.cache_full_blocks(request=req, blocks=blocks, num_cached_blocks=0,
                                 num_full_blocks=2, block_size=block_size)
    assert len(block_pool.cached_block_hash_to_block) == 2
    assert all(block.block_hash is not None for block in blocks)

    blocks += [KVCacheBlock(block_id=2)]
    block_pool.cache_full_blocks(request=req, blocks=blocks, num_cached_blocks=2,
                                 num_full_blocks=3, block_size=block_size)
    assert len(block_pool.cached_block_hash_to_block) == 3
    assert blocks[2].block_hash == req.block_hashes[2]


def test_cache_full_blocks_skips_null_block():
    block_size = 1
    pool = BlockPool(num_gpu_blocks=8, enable_caching=True)
    req = make_request("r", [10, 11, 12, 13], block_size)
    new_blocks = pool.get_new_blocks(3)
    blocks = [new_blocks[0], pool.null_block, *new_blocks[1:]]
    pool.cache_full_blocks(request=req, blocks=blocks, num_cached_blocks=1,
                           num_full_blocks=4, block_size=block_size)
    assert pool.null_block.block_hash is None
    assert [b.block_hash for b in blocks[2:]] == req.block_hashes[2:4]


@pytest.mark.skip(reason=NOT_HERE)
def test_cache_blocks_multi_group():
    """Upstream: one request caching blocks into several KV cache groups."""


@pytest.mark.skip(reason=NOT_HERE)
def test_mm_prefix_caching():
    """Upstream: multimodal placeholders keyed by mm hash."""


def test_cache_key_salting():
    block_size = 16
    manager = make_kv_cache_manager(block_size, 11)
    common_token_ids = [i for i in range(3) for _ in range(block_size)]
    token_ids = common_token_ids + [3] * 11
    req0 = make_request("0", token_ids, block_size, cache_salt="salt1")
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req0)
    assert not computed_blocks.blocks and num_computed_tokens == 0
    block_hashes = req0.block_hashes
    assert len(block_hashes) == 3
    assert block_hashes[0] == hash_block_tokens(
        kv_cache_utils.NONE_HASH, tuple(token_ids[:block_size]), (("cache_salt", "salt1"),))
    assert block_hashes[1] == hash_block_tokens(
        block_hashes[0], tuple(token_ids[block_size:block_size * 2]))
    assert block_hashes[2] == hash_block_tokens(
        block_hashes[1], tuple(token_ids[block_size * 2:block_size * 3]))

    blocks = manager.allocate_slots(req0, 59, 0, computed_blocks)
    assert blocks is not None and blocks.get_block_ids() == [1, 2, 3, 4]
    req0.num_computed_tokens = 59
    for _ in range(5):
        req0.append_output_token_ids(8)
    new_blocks = manager.allocate_slots(req0, 5)
    assert new_blocks is not None and len(new_blocks.blocks) == 0
    assert len(block_hashes) == 4
    assert block_hashes[3] == hash_block_tokens(
        block_hashes[2], tuple(token_ids[3 * block_size:] + [8] * 5))

    # same salt: hit
    token_ids = common_token_ids + [4] * 11
    req1 = make_request("1", token_ids, block_size, cache_salt="salt1")
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req1)
    assert len(computed_blocks.blocks) == 3
    assert num_computed_tokens == 3 * block_size

    # different salt (or none): miss
    for salt in ("salt2", None):
        req2 = make_request("2", token_ids, block_size, cache_salt=salt)
        computed_blocks, num_computed_tokens = manager.get_computed_blocks(req2)
        assert len(computed_blocks.blocks) == 0 and num_computed_tokens == 0
    assert req2.block_hashes[1] != req1.block_hashes[1]  # the salt chains through


def test_prefill_not_enough_free_blocks_with_computed_blocks():
    """When allocation fails, the hit blocks are not touched."""
    block_size = 16
    manager = make_kv_cache_manager(block_size, 11)
    common_token_ids = [i for i in range(3) for _ in range(16)]
    req0 = make_request("0", common_token_ids, block_size)
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req0)
    assert not computed_blocks.blocks and num_computed_tokens == 0
    manager.allocate_slots(req0, 48, 0, computed_blocks)
    block_part0 = req_blocks(manager, "0")

    req1 = make_request("1", common_token_ids * 2, block_size)
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req1)
    assert computed_blocks.blocks == block_part0
    assert num_computed_tokens == 3 * 16
    manager.allocate_slots(req1, 48, 48, computed_blocks)
    block_part1 = list(req_blocks(manager, "1"))
    manager.free(req1)
    assert {block.ref_cnt for block in block_part1[:3]} == {1}
    assert {block.ref_cnt for block in block_part1[3:]} == {0}

    req2 = make_request("2", [7] * block_size * 2, block_size)
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req2)
    assert not computed_blocks.blocks and num_computed_tokens == 0
    manager.allocate_slots(req2, block_size * 2, 0, computed_blocks)

    # req3 hits 6 blocks but needs 3 more with only 2 truly free
    assert manager.block_pool.free_block_queue.num_free_blocks == 5
    req3 = make_request("3", common_token_ids * 3, block_size)
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req3)
    assert computed_blocks.blocks == block_part1
    assert num_computed_tokens == 6 * 16
    assert manager.allocate_slots(req3, 48, 96, computed_blocks) is None
    assert {block.ref_cnt for block in block_part1[:3]} == {1}
    assert {block.ref_cnt for block in block_part1[3:]} == {0}


def test_reset_prefix_cache():
    block_size = 16
    manager = make_kv_cache_manager(block_size, 11)
    full_block_token_ids = [i for i in range(3) for _ in range(16)]
    req0 = make_request("0", full_block_token_ids + [3] * 7, block_size)
    blocks = manager.allocate_slots(req0, 55)
    assert blocks is not None and blocks.get_block_ids() == [1, 2, 3, 4]

    req1 = make_request("1", full_block_token_ids + [4] * 7, block_size)
    computed_blocks, _ = manager.get_computed_blocks(req1)
    assert len(req1.block_hashes) == 3
    assert len(computed_blocks.blocks) == 3
    blocks = manager.allocate_slots(req1, 7, 48, computed_blocks)
    assert blocks is not None and blocks.get_block_ids() == [5]

    assert not manager.reset_prefix_cache()  # blocks still in use
    assert manager.block_pool.cached_block_hash_to_block
    manager.free(req0)
    manager.free(req1)
    assert manager.reset_prefix_cache()
    assert not manager.block_pool.cached_block_hash_to_block
    assert all(blk.block_hash is None for blk in manager.block_pool.blocks)
    stats = manager.make_prefix_cache_stats()
    assert stats is not None and stats.reset


def test_prefix_cache_stats_disabled():
    block_size = 16
    manager = make_kv_cache_manager(block_size, 11, log_stats=False)
    assert manager.prefix_cache_stats is None
    req = make_request("0", list(range(16)), block_size)
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(req)
    assert not computed_blocks.blocks and num_computed_tokens == 0
    manager.allocate_slots(req, 16, 0, computed_blocks)
    manager.record_prefix_cache_stats(req, 0)
    manager.reset_prefix_cache()
    assert manager.prefix_cache_stats is None
    assert manager.make_prefix_cache_stats() is None


def test_prefix_cache_stats_record_and_swap():
    manager = make_kv_cache_manager(4, 11)
    req = make_request("0", list(range(10)), 4)
    manager.record_prefix_cache_stats(req, 8)
    req.num_preemptions = 1
    manager.record_prefix_cache_stats(req, 4)
    stats = manager.make_prefix_cache_stats()
    assert (stats.requests, stats.queries, stats.hits) == (1, 10, 8)
    assert (stats.preempted_requests, stats.preempted_queries, stats.preempted_hits) == \
        (1, 10, 4)
    fresh = manager.make_prefix_cache_stats()
    assert (fresh.requests, fresh.queries, fresh.hits, fresh.reset) == (0, 0, 0, False)
    # a request that skips reading the cache is not counted (vLLM record_prefix_cache_stats)
    manager.record_prefix_cache_stats(make_request("1", [1] * 8, 4, prompt_logprobs=0), 0)
    assert manager.make_prefix_cache_stats().requests == 0


def test_maybe_evict_cached_block():
    pool = BlockPool(num_gpu_blocks=4, enable_caching=True)
    block_hash0, block_hash1, block_hash2 = b"10", b"20", b"30"
    block_hashes = [block_hash0, block_hash1, block_hash2, block_hash0]  # block3 == block0
    assert len(pool.blocks) == len(block_hashes)
    for block, block_hash in zip(pool.blocks, block_hashes):
        block.set_block_hash(block_hash)
        pool.cached_block_hash_to_block.insert(block_hash, block)
    block0, block1, block2, block3 = pool.blocks
    assert pool.cached_block_hash_to_block._cache == {
        block_hash0: {block0.block_id: block0, block3.block_id: block3},
        block_hash1: block1,
        block_hash2: block2,
    }
    pool._maybe_evict_cached_block(block1)
    assert pool.cached_block_hash_to_block._cache == {
        block_hash0: {block0.block_id: block0, block3.block_id: block3},
        block_hash2: block2,
    }
    # block_hash0 stays: block3 still holds it
    pool._maybe_evict_cached_block(block0)
    assert pool.cached_block_hash_to_block._cache == {
        block_hash0: {block3.block_id: block3}, block_hash2: block2}
    pool._maybe_evict_cached_block(block2)
    assert pool.cached_block_hash_to_block._cache == {block_hash0: {3: block3}}
    pool._maybe_evict_cached_block(block3)
    assert pool.cached_block_hash_to_block._cache == {}


@pytest.mark.skip(reason=NOT_HERE)
def test_kv_cache_events():
    """Upstream: BlockStored / BlockRemoved / AllBlocksCleared events."""


def test_block_lookup_cache_single_block_per_key():
    cache = BlockHashToBlockMap()
    key0, key1, key2 = b"hash0", b"hash1", b"hash2"
    block0, block1 = KVCacheBlock(0), KVCacheBlock(1)
    assert cache.get_one_block(key0) is None
    assert cache.get_one_block(key1) is None
    assert cache.get_one_block(key2) is None
    cache.insert(key0, block0)
    assert cache.get_one_block(key0) is block0
    assert cache.get_one_block(key1) is None
    cache.insert(key1, block1)
    assert cache.get_one_block(key0) is block0
    assert cache.get_one_block(key1) is block1
    assert cache.contain(key0, 0) and not cache.contain(key0, 1)
    # no pop on a block-id mismatch
    assert cache.pop(key0, 100) is None
    assert cache.get_one_block(key0) is block0
    assert cache.pop(key0, 0) is block0
    assert cache.get_one_block(key0) is None
    assert cache.get_one_block(key1) is block1
    assert cache.pop(key0, 1) is None
    assert cache.pop(key1, 1) is block1
    assert cache.get_one_block(key1) is None
    assert cache.get_one_block(key2) is None
    assert len(cache) == 0


def test_block_lookup_cache_multi_blocks_per_key():
    cache = BlockHashToBlockMap()
    key0, key1 = b"hash0", b"hash1"
    block00, block01, block10, block11 = (KVCacheBlock(i) for i in (0, 1, 10, 11))
    cache.insert(key0, block00)
    cache.insert(key0, block01)
    cache.insert(key1, block10)
    cache.insert(key1, block11)
    assert cache.get_one_block(key0) is block00
    assert cache.pop(key0, 0) is block00
    assert cache.get_one_block(key0) is block01
    assert cache.pop(key0, 1) is block01
    assert cache.get_one_block(key0) is None
    assert cache.pop(key0, 2) is None
    assert cache.get_one_block(key1) is block10
    assert cache.pop(key1, 10) is block10
    assert cache.get_one_block(key1) is block11
    assert cache.pop(key1, 11) is block11
    assert cache.get_one_block(key1) is None
    assert cache.pop(key1, 12) is None


def test_duplicate_hash_blocks_are_not_deduplicated():
    """Two requests that fill identical blocks without a hit both cache them
    (append-only block tables); the map then holds both, lookups return the first."""
    block_size = 4
    manager = make_kv_cache_manager(block_size, 11)
    r0 = make_request("0", list(range(9)), block_size)
    r1 = make_request("1", list(range(9)), block_size)
    manager.allocate_slots(r0, 9)
    manager.allocate_slots(r1, 9)  # no lookup: fresh blocks with the same hashes
    ids0, ids1 = manager.get_block_ids("0"), manager.get_block_ids("1")
    assert ids0[:2] != ids1[:2]
    pool = manager.block_pool
    assert pool.get_cached_block(r0.block_hashes[0]).block_id == ids0[0]
    manager.free(r0)
    manager.free(r1)
    r2 = make_request("2", list(range(9)), block_size)
    hit, n = manager.get_computed_blocks(r2)
    assert n == 8 and hit.get_block_ids() == ids0[:2]


def test_full_sequence_must_fit_gates_admission():
    """scheduler_reserve_full_isl: admit only if the whole prompt fits."""
    manager = make_kv_cache_manager(4, 5)  # 4 usable blocks
    req = make_request("0", list(range(20)), 4)  # 5 blocks
    assert manager.allocate_slots(req, 8, full_sequence_must_fit=True) is None
    assert manager.block_pool.get_num_free_blocks() == 4
    assert manager.allocate_slots(req, 8).get_block_ids() == [1, 2]


def test_watermark_applies_to_waiting_requests_only():
    manager = KVCacheManager(11, 4, max_model_len=64, enable_caching=True, watermark=0.3)
    assert manager.watermark_blocks == 3
    req = make_request("0", list(range(28)), 4)  # 7 blocks; 10 free - 3 watermark = 7
    assert manager.allocate_slots(req, 28).get_block_ids() == list(range(1, 8))
    other = make_request("1", list(range(4)), 4)
    assert manager.allocate_slots(other, 4) is None  # 3 free, all watermark
    assert manager.allocate_slots(other, 4, has_scheduled_reqs=False) is not None


def test_allocate_slots_rejects_empty_allocation():
    manager = make_kv_cache_manager(4, 5)
    with pytest.raises(ValueError, match="num_new_tokens must be greater than 0"):
        manager.allocate_slots(make_request("0", [1, 2], 4), 0)


def test_usage_counts_blocks_in_use():
    manager = make_kv_cache_manager(4, 5)  # 4 usable
    assert manager.usage == 0.0
    req = make_request("0", list(range(6)), 4)
    manager.allocate_slots(req, 6)
    assert manager.usage == 0.5
    manager.free(req)
    assert manager.usage == 0.0
