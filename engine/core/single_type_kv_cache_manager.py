"""Per-group block managers, as vllm/v1/core/single_type_kv_cache_manager.py:
FullAttentionManager (per-request block lists of the full-attention KV group; no sliding
window, no null-block padding, no partial hits) and MambaManager in mamba_cache_mode
"none" (one state block per running request of a Gated DeltaNet group, from the same
block pool; prefix-cache snapshots of the state are engine/core/mamba_align.py's).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from libvllm.engine.core.block_pool import BlockPool
from libvllm.engine.core.kv_cache_utils import BlockHash, KVCacheBlock
from libvllm.engine.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class FullAttentionManager:
    def __init__(self, block_pool: BlockPool, block_size: int) -> None:
        self.block_pool = block_pool
        self.block_size = block_size
        self.enable_caching = block_pool.enable_caching
        self.req_to_blocks: defaultdict[str, list[KVCacheBlock]] = defaultdict(list)
        # req_id -> number of its blocks already in the prefix cache (running requests)
        self.num_cached_block: dict[str, int] = {}

    def find_longest_cache_hit(self, block_hashes: Sequence[BlockHash],
                               max_length: int) -> list[KVCacheBlock]:
        """Cached blocks for the longest prefix of at most max_length tokens; the chain
        makes the first miss the end of the hit."""
        hits = []
        for block_hash in block_hashes[:max_length // self.block_size]:
            block = self.block_pool.get_cached_block(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits

    def get_num_blocks_to_allocate(self, request_id: str, num_tokens: int,
                                   new_computed_blocks: Sequence[KVCacheBlock]) -> int:
        """Free blocks the allocation takes: new blocks, plus the hits that sit in the
        free queue (ref 0), which leave it when touched."""
        num_required = cdiv(num_tokens, self.block_size)
        num_req_blocks = len(self.req_to_blocks.get(request_id, ()))
        if request_id in self.num_cached_block:  # running: no new hits
            assert not new_computed_blocks
            return max(num_required - num_req_blocks, 0)
        num_new = max(num_required - len(new_computed_blocks) - num_req_blocks, 0)
        num_evictable = sum(b.ref_cnt == 0 and not b.is_null for b in new_computed_blocks)
        return num_new + num_evictable

    def add_local_computed_blocks(self, request_id: str,
                                  new_computed_blocks: Sequence[KVCacheBlock]) -> None:
        """Adopt prefix-cache hits (first allocation of the request only)."""
        req_blocks = self.req_to_blocks[request_id]
        assert not req_blocks
        self.block_pool.touch(new_computed_blocks)
        req_blocks.extend(new_computed_blocks)
        self.num_cached_block[request_id] = len(req_blocks)

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[KVCacheBlock]:
        """Grow the request to at least num_tokens slots; returns the new blocks."""
        req_blocks = self.req_to_blocks[request_id]
        num_new = cdiv(num_tokens, self.block_size) - len(req_blocks)
        if num_new <= 0:
            return []
        new_blocks = self.block_pool.get_new_blocks(num_new)
        req_blocks.extend(new_blocks)
        return new_blocks

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Cache the request's full blocks among its first num_tokens tokens."""
        num_cached = self.num_cached_block.get(request.request_id, 0)
        num_hashed = len(request.block_hashes) * self.block_size
        num_full = min(num_tokens, num_hashed) // self.block_size
        if num_cached >= num_full:
            return
        self.block_pool.cache_full_blocks(request, self.req_to_blocks[request.request_id],
                                          num_cached, num_full, self.block_size)
        self.num_cached_block[request.request_id] = num_full

    def free(self, request_id: str) -> None:
        """Return the blocks tail-first, so a sequence's tail is evicted first."""
        blocks = self.req_to_blocks.pop(request_id, [])
        self.num_cached_block.pop(request_id, None)
        self.block_pool.free_blocks(reversed(blocks))


class MambaManager:
    """One Gated DeltaNet group: a running request holds exactly one state block (the
    state summarises its whole prefix), taken at its first allocation, freed with it."""

    def __init__(self, block_pool: BlockPool) -> None:
        self.block_pool = block_pool
        self.req_to_block: dict[str, KVCacheBlock] = {}

    def get_num_blocks_to_allocate(self, request_id: str) -> int:
        return 0 if request_id in self.req_to_block else 1

    def allocate_new_blocks(self, request_id: str) -> list[KVCacheBlock]:
        if request_id in self.req_to_block:
            return []
        block = self.req_to_block[request_id] = self.block_pool.get_new_blocks(1)[0]
        return [block]

    def free(self, request_id: str) -> None:
        block = self.req_to_block.pop(request_id, None)
        if block is not None:
            self.block_pool.free_blocks((block,))
