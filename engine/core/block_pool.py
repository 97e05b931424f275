"""BlockPool: owns every KVCacheBlock, the free queue and the prefix-cache map.

Mirrors vllm/v1/core/block_pool.py. Block 0 is the null block (never allocated), as
upstream. A cached block stays in the hash map while free, until it is evicted by
get_new_blocks.
"""

from __future__ import annotations

from engine.core.kv_cache_utils import BlockHash, FreeKVCacheBlockQueue, KVCacheBlock


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool) -> None:
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block: dict[BlockHash, KVCacheBlock] = {}
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True

    def get_cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        return self.cached_block_hash_to_block.get(block_hash)

    def cache_full_blocks(self, blocks: list[KVCacheBlock], block_hashes: list[BlockHash],
                          num_cached_blocks: int, num_full_blocks: int) -> None:
        """Register blocks[num_cached_blocks:num_full_blocks] under their hashes."""
        if not self.enable_caching:
            return
        for i in range(num_cached_blocks, num_full_blocks):
            blk = blocks[i]
            if blk.block_hash is None:
                blk.block_hash = block_hashes[i]
                self.cached_block_hash_to_block.setdefault(blk.block_hash, blk)

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        out = []
        for _ in range(num_blocks):
            blk = self.free_block_queue.popleft()
            self._maybe_evict_cached_block(blk)
            blk.ref_cnt += 1
            out.append(blk)
        return out

    def _maybe_evict_cached_block(self, blk: KVCacheBlock) -> None:
        if blk.block_hash is None:
            return
        if self.cached_block_hash_to_block.get(blk.block_hash) is blk:
            del self.cached_block_hash_to_block[blk.block_hash]
        blk.block_hash = None

    def touch(self, blocks: list[KVCacheBlock]) -> None:
        """Take a reference on prefix-cache hits; a free hit leaves the free queue."""
        for blk in blocks:
            if blk.ref_cnt == 0 and not blk.is_null:
                self.free_block_queue.remove(blk)
            blk.ref_cnt += 1

    def free_blocks(self, ordered_blocks: list[KVCacheBlock]) -> None:
        """Drop a reference; blocks reaching 0 go to the back of the free queue in order."""
        for blk in ordered_blocks:
            blk.ref_cnt -= 1
            if blk.ref_cnt == 0 and not blk.is_null:
                self.free_block_queue.append(blk)

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        total = self.num_blocks - 1  # the null block is never usable
        return 1.0 - self.get_num_free_blocks() / total if total else 0.0

    def reset_prefix_cache(self) -> bool:
        if self.get_num_free_blocks() != self.num_blocks - 1:
            return False  # blocks in use: vLLM refuses too
        for blk in self.blocks:
            blk.block_hash = None
        self.cached_block_hash_to_block.clear()
        return True
