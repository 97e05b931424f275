"""Prefix caching for hybrid (Gated DeltaNet) models: vLLM's mamba_cache_mode "align"
(vllm/config/cache.py; vllm/v1/core/single_type_kv_cache_manager.py MambaManager,
vllm/v1/core/kv_cache_coordinator.py HybridKVCacheCoordinator, the scheduler's
block-aligned split in vllm/v1/core/sched/scheduler.py).

A GDN layer's state summarises the whole prefix, so a prefix-cache hit of k attention
blocks is usable only if the state after exactly k blocks was kept. The scheduler ends
prefill chunks on block boundaries (a prompt's last full block boundary gets a step of
its own), and whenever a step ends at token k * block_size it takes one block per GDN
group from the shared block pool and asks the runner to copy the request's state into
them (`mamba_saves` of the SchedulerOutput; a prefill step's state may evict the least
recently used cached blocks, a decode step's only takes blocks holding nothing, so a small
pool keeps prompt prefixes). At the next schedule() those blocks go back
to the pool as cached blocks under the key (block hash, group id) (vLLM's
BlockHashWithGroupId), evictable in LRU order like any cached KV block. A new request's
hit is trimmed to the longest prefix whose last block has a state in every group (the
hybrid coordinator's intersection of the attention and state hits); those blocks are
held until the next schedule() and the runner starts the request's own state blocks from
copies of them (`NewRequestData.mamba_restore_block_ids`). The runner issues a step's
copies before the next step's, so a block released at the next schedule() is read or
written before its next owner touches it.
"""

from __future__ import annotations

from libvllm.engine.core.block_pool import BlockPool
from libvllm.engine.core.kv_cache_utils import BlockHash, KVCacheBlock
from libvllm.engine.request import Request


def make_block_hash_with_group_id(block_hash: BlockHash, group_id: int) -> BlockHash:
    """vLLM's BlockHashWithGroupId: the block hash followed by the 4-byte group id."""
    return BlockHash(block_hash + group_id.to_bytes(4, "big", signed=False))


class MambaAlignCache:
    def __init__(self, block_pool: BlockPool, block_size: int, num_groups: int) -> None:
        assert block_pool.enable_caching and num_groups > 0
        self.block_pool = block_pool
        self.block_size = block_size
        self.num_groups = num_groups
        # blocks held for this step's copies: saves (with the key they get) and restores
        self.pending_saves: list[tuple[list[KVCacheBlock], list[BlockHash]]] = []
        self.pending_restores: list[KVCacheBlock] = []

    def _keys(self, block_hash: BlockHash) -> list[BlockHash]:
        # group 0 is the attention group (its blocks keep the plain hash)
        return [make_block_hash_with_group_id(block_hash, g + 1)
                for g in range(self.num_groups)]

    def _cached(self, block_hash: BlockHash) -> list[KVCacheBlock] | None:
        blocks = [self.block_pool.get_cached_block(k) for k in self._keys(block_hash)]
        return None if any(b is None for b in blocks) else blocks

    def _uncached_blocks_free(self) -> bool:
        """Whether the next num_groups blocks off the free queue hold no cached data
        (blocks without a hash are queued first)."""
        block = self.block_pool.free_block_queue.fake_free_list_head.next_free_block
        for _ in range(self.num_groups):
            if block.block_hash is not None:
                return False
            block = block.next_free_block
        return True

    def release_pending(self) -> None:
        """Start of schedule(): the last step's copies are issued; saved states become
        cached blocks, restored ones lose the hold."""
        for blocks, keys in self.pending_saves:
            for block, key in zip(blocks, keys):
                block.set_block_hash(key)
                self.block_pool.cached_block_hash_to_block.insert(key, block)
            self.block_pool.free_blocks(blocks)
        self.block_pool.free_blocks(self.pending_restores)
        self.pending_saves, self.pending_restores = [], []

    def trim_hit(self, request: Request, num_hit_blocks: int) -> tuple[int, list[int] | None]:
        """(usable hit blocks, state block per group to start from): the longest prefix
        of the attention hit whose last block has a saved state in every group."""
        for k in range(num_hit_blocks, 0, -1):
            blocks = self._cached(request.block_hashes[k - 1])
            if blocks is not None:
                self.block_pool.touch(blocks)
                self.pending_restores += blocks
                return k, [b.block_id for b in blocks]
        return 0, None

    def align_num_new(self, start: int, num_new: int) -> int:
        """Tokens to schedule from `start`: a prefill chunk ends on a block boundary when
        one lies inside it, so that its state can be kept (decode steps are not split)."""
        aligned = (start + num_new) // self.block_size * self.block_size
        return aligned - start if num_new > 1 and start < aligned < start + num_new \
            else num_new

    def plan_save(self, request: Request, num_new: int) -> list[int] | None:
        """The state blocks (one per group) the runner copies this request's state into
        after this step (a step ending at k * block_size, block k's hash known and its
        state not yet kept); None when there is nothing to keep or the pool is short."""
        end = request.num_computed_tokens + num_new
        k = end // self.block_size
        if end % self.block_size or k == 0 or k > len(request.block_hashes):
            return None
        h = request.block_hashes[k - 1]
        if self._cached(h) is not None or \
                self.block_pool.get_num_free_blocks() < self.num_groups:
            return None
        if num_new == 1 and not self._uncached_blocks_free():
            return None  # decode-time states evict no cached block
        blocks = self.block_pool.get_new_blocks(self.num_groups)
        self.pending_saves.append((blocks, self._keys(h)))
        return [b.block_id for b in blocks]
