"""KVCacheManager: per-request block lists on top of the BlockPool, as
vllm/v1/core/kv_cache_manager.py (single full-attention group).

get_computed_blocks finds the longest cached prefix; allocate_slots grows a
request's blocks for this step's tokens or returns None when the pool is short
(the scheduler then preempts); free returns a request's blocks tail-first.
"""

from __future__ import annotations

from engine.core.block_pool import BlockPool
from engine.core.kv_cache_utils import KVCacheBlock
from engine.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, max_model_len: int,
                 enable_caching: bool) -> None:
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(num_blocks, enable_caching)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_block: dict[str, int] = {}
        self.prefix_cache_queries = 0  # tokens looked up
        self.prefix_cache_hits = 0  # tokens found

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        if not self.enable_caching:
            return [], 0
        # at least one token must be computed to produce logits
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        hits: list[KVCacheBlock] = []
        for h in request.block_hashes[:max_hit_blocks]:
            blk = self.block_pool.get_cached_block(h)
            if blk is None:
                break
            hits.append(blk)
        self.prefix_cache_queries += request.num_tokens
        self.prefix_cache_hits += len(hits) * self.block_size
        return hits, len(hits) * self.block_size

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       new_computed_blocks: list[KVCacheBlock] | None = None
                       ) -> list[KVCacheBlock] | None:
        new_computed_blocks = new_computed_blocks or []
        blocks = self.req_to_blocks.setdefault(request.request_id, [])
        num_computed = request.num_computed_tokens + len(new_computed_blocks) * self.block_size
        total = min(num_computed + num_new_tokens, self.max_model_len)
        num_required = cdiv(total, self.block_size) - len(blocks) - len(new_computed_blocks)
        # hits that sit in the free queue stop being allocatable once touched
        evictable_hits = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
        if num_required > self.block_pool.get_num_free_blocks() - evictable_hits:
            return None
        self.block_pool.touch(new_computed_blocks)
        blocks.extend(new_computed_blocks)
        new_blocks = self.block_pool.get_new_blocks(max(num_required, 0))
        blocks.extend(new_blocks)
        num_full = min(total, request.num_tokens) // self.block_size
        cached = self.num_cached_block.get(request.request_id, 0)
        self.block_pool.cache_full_blocks(blocks, request.block_hashes, cached, num_full)
        self.num_cached_block[request.request_id] = max(cached, num_full)
        return new_blocks

    def free(self, request: Request) -> None:
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.num_cached_block.pop(request.request_id, None)
        self.block_pool.free_blocks(reversed(blocks))

    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(request_id, [])]
