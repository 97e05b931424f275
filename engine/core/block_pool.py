"""BlockPool: owns every KVCacheBlock, the free queue and the prefix-cache map, as
vllm/v1/core/block_pool.py (one KV cache group, so hash keys carry no group id).

Block 0 is the null block (popped at start, never freed, its ref count not kept). A
cached block stays in the hash map while free, until get_new_blocks hands it out again
(lazy eviction). Identical blocks are not de-duplicated (block tables stay append-only),
so one hash may map to several blocks.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from libvllm.engine.core.kv_cache_utils import BlockHash, FreeKVCacheBlockQueue, KVCacheBlock
from libvllm.engine.request import Request


class BlockHashToBlockMap:
    """hash -> one block, or {block_id: block} once a hash has duplicates."""

    def __init__(self) -> None:
        self._cache: dict[BlockHash, KVCacheBlock | dict[int, KVCacheBlock]] = {}

    def get_one_block(self, key: BlockHash) -> KVCacheBlock | None:
        blocks = self._cache.get(key)
        if isinstance(blocks, dict):
            return next(iter(blocks.values()))
        return blocks

    def contain(self, key: BlockHash, block_id: int) -> bool:
        blocks = self._cache.get(key)
        if isinstance(blocks, dict):
            return block_id in blocks
        return blocks is not None and blocks.block_id == block_id

    def insert(self, key: BlockHash, block: KVCacheBlock) -> None:
        blocks = self._cache.get(key)
        if blocks is None:
            self._cache[key] = block
        elif isinstance(blocks, KVCacheBlock):
            self._cache[key] = {blocks.block_id: blocks, block.block_id: block}
        else:
            blocks[block.block_id] = block

    def pop(self, key: BlockHash, block_id: int) -> KVCacheBlock | None:
        blocks = self._cache.pop(key, None)
        if blocks is None:
            return None
        if isinstance(blocks, KVCacheBlock):
            if blocks.block_id == block_id:
                return blocks
            self._cache[key] = blocks  # another block holds this hash: put it back
            return None
        block = blocks.pop(block_id, None)
        if blocks:
            self._cache[key] = blocks
        return block

    def __len__(self) -> int:
        return len(self._cache)


class BlockPool:
    def __init__(self, num_gpu_blocks: int, enable_caching: bool) -> None:
        assert num_gpu_blocks > 0
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True

    def get_cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        return self.cached_block_hash_to_block.get_one_block(block_hash)

    def cache_full_blocks(self, request: Request, blocks: list[KVCacheBlock],
                          num_cached_blocks: int, num_full_blocks: int,
                          block_size: int) -> None:
        """Register blocks[num_cached_blocks:num_full_blocks] under the request's hashes."""
        assert block_size == request.block_size
        for i in range(num_cached_blocks, num_full_blocks):
            block = blocks[i]
            if block.is_null:
                continue
            block.set_block_hash(request.block_hashes[i])
            self.cached_block_hash_to_block.insert(block.block_hash, block)

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop free blocks (evicting their cached hash) with one reference each."""
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        blocks = self.free_block_queue.popleft_n(num_blocks)
        for block in blocks:
            if self.enable_caching:
                self._maybe_evict_cached_block(block)
            assert block.ref_cnt == 0
            block.ref_cnt += 1
        return blocks

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        block_hash = block.block_hash
        if block_hash is None:
            return False
        self.cached_block_hash_to_block.pop(block_hash, block.block_id)
        block.reset_hash()
        return True

    def touch(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Take a reference on prefix-cache hits; a free hit leaves the free queue."""
        for block in blocks:
            if block.is_null:
                continue
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference each, in eviction-priority order. Blocks reaching 0 without
        a hash are prepended (reused first); cached ones are appended (LRU)."""
        evict_first, evict_last = [], []
        for block in ordered_blocks:
            if block.is_null:
                continue
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if block.block_hash is None or not self.enable_caching:
                    evict_first.append(block)
                else:
                    evict_last.append(block)
        self.free_block_queue.prepend_n(evict_first)
        self.free_block_queue.append_n(evict_last)

    def reset_prefix_cache(self) -> bool:
        """Drop every hash; refused (False) while any block is in use."""
        if self.num_gpu_blocks - self.get_num_free_blocks() != 1:  # the null block
            return False
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        for block in self.blocks:
            block.reset_hash()
        return True

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        total = self.num_gpu_blocks - 1  # the null block is never usable
        return 1.0 - self.get_num_free_blocks() / total if total else 0.0
