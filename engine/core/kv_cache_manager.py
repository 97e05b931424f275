"""KVCacheManager: the scheduler's interface to the KV cache, as
vllm/v1/core/kv_cache_manager.py with its coordinator folded in (one full-attention group;
for a hybrid model also one MambaManager per Gated DeltaNet group, vLLM's
HybridKVCacheCoordinator in mamba_cache_mode "none": every group draws from one pool).

get_computed_blocks finds the longest cached prefix (never the last token, which must be
recomputed for logits); allocate_slots adopts those hits and grows a request's blocks
for this step's tokens (plus, at its first allocation, one state block per GDN group),
or returns None when the pool is short (the scheduler then preempts or waits); free
returns a request's blocks tail-first, then its state blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from libvllm.engine.core.block_pool import BlockPool
from libvllm.engine.core.kv_cache_utils import KVCacheBlock
from libvllm.engine.core.single_type_kv_cache_manager import FullAttentionManager, MambaManager
from libvllm.engine.metrics import PrefixCacheStats
from libvllm.engine.request import Request, RequestStatus


@dataclass
class KVCacheBlocks:
    """Allocation result handed to the scheduler (one KV group: a flat block list)."""

    blocks: Sequence[KVCacheBlock]

    def get_block_ids(self) -> list[int]:
        return [block.block_id for block in self.blocks]


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, max_model_len: int,
                 enable_caching: bool, log_stats: bool = True, watermark: float = 0.0,
                 num_mamba_groups: int = 0) -> None:
        assert 0.0 <= watermark < 1.0, "watermark must be in [0, 1)"
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.log_stats = log_stats
        self.prefix_cache_stats = PrefixCacheStats() if log_stats else None
        self.block_pool = BlockPool(num_blocks, enable_caching)
        self.single_type_manager = FullAttentionManager(self.block_pool, block_size)
        self.mamba_managers = [MambaManager(self.block_pool) for _ in range(num_mamba_groups)]
        # blocks kept free when admitting waiting/preempted requests
        self.watermark_blocks = int(watermark * num_blocks)
        self.empty_kv_cache_blocks = KVCacheBlocks(())

    @property
    def usage(self) -> float:
        """Fraction of the KV cache in use (0.0-1.0)."""
        return self.block_pool.get_usage()

    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        """The stats since the last call (a fresh accumulator replaces them)."""
        if not self.log_stats:
            return None
        stats, self.prefix_cache_stats = self.prefix_cache_stats, PrefixCacheStats()
        return stats

    def prefix_cache_lookup_enabled(self, request: Request) -> bool:
        return self.enable_caching and not request.skip_reading_prefix_cache

    def record_prefix_cache_stats(self, request: Request, num_hits: int) -> None:
        if not self.log_stats or not self.prefix_cache_lookup_enabled(request):
            return
        self.prefix_cache_stats.record(num_tokens=request.num_tokens, num_hits=num_hits,
                                       preempted=request.num_preemptions > 0)

    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int]:
        """(cached blocks, number of computed tokens) of the request's longest hit."""
        if not self.prefix_cache_lookup_enabled(request):
            return self.empty_kv_cache_blocks, 0
        # all-hit prompts still recompute the last token (a whole block) for logits
        hits = self.single_type_manager.find_longest_cache_hit(request.block_hashes,
                                                               request.num_tokens - 1)
        if not hits:
            return self.empty_kv_cache_blocks, 0
        return KVCacheBlocks(hits), len(hits) * self.block_size

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       num_new_computed_tokens: int = 0,
                       new_computed_blocks: KVCacheBlocks | None = None,
                       full_sequence_must_fit: bool = False,
                       has_scheduled_reqs: bool = True) -> KVCacheBlocks | None:
        """Slots for num_new_tokens after the request's computed tokens and its new
        prefix hits. None (hits untouched) when the free blocks do not suffice; with
        full_sequence_must_fit, the whole prompt must fit (admission gate)."""
        if num_new_tokens == 0 and num_new_computed_tokens == 0:
            raise ValueError("num_new_tokens must be greater than 0 when there are no "
                             "computed tokens to adopt")
        hits = new_computed_blocks.blocks if new_computed_blocks is not None else ()
        manager = self.single_type_manager
        num_computed = request.num_computed_tokens + num_new_computed_tokens
        watermark = 0
        if has_scheduled_reqs and request.status in (RequestStatus.WAITING,
                                                     RequestStatus.PREEMPTED):
            watermark = self.watermark_blocks
        rid = request.request_id
        # the state blocks a new request takes come out of the same pool
        free = self.block_pool.get_num_free_blocks() - watermark - sum(
            m.get_num_blocks_to_allocate(rid) for m in self.mamba_managers)
        if full_sequence_must_fit:
            full = min(request.num_tokens, self.max_model_len)
            if manager.get_num_blocks_to_allocate(rid, full, hits) > free:
                return None
        num_tokens_need_slot = min(num_computed + num_new_tokens, self.max_model_len)
        if manager.get_num_blocks_to_allocate(rid, num_tokens_need_slot, hits) > free:
            return None
        if rid not in manager.num_cached_block and hits:
            manager.add_local_computed_blocks(rid, hits)
        for mamba in self.mamba_managers:
            mamba.allocate_new_blocks(rid)
        new_blocks = manager.allocate_new_blocks(rid, num_tokens_need_slot)
        if self.enable_caching:
            manager.cache_blocks(request, min(num_computed + num_new_tokens,
                                              request.num_tokens))
        return KVCacheBlocks(new_blocks) if new_blocks else self.empty_kv_cache_blocks

    def free(self, request: Request) -> None:
        self.single_type_manager.free(request.request_id)
        for mamba in self.mamba_managers:
            mamba.free(request.request_id)

    def reset_prefix_cache(self) -> bool:
        if not self.block_pool.reset_prefix_cache():
            return False
        if self.log_stats:
            self.prefix_cache_stats.reset = True
        return True

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return KVCacheBlocks(self.single_type_manager.req_to_blocks.get(request_id, ()))

    def get_block_ids(self, request_id: str) -> list[int]:
        return self.get_blocks(request_id).get_block_ids()

    def get_state_block_ids(self, request_id: str) -> list[int]:
        """The request's state block per GDN group ([] for a model without GDN layers)."""
        return [m.req_to_block[request_id].block_id for m in self.mamba_managers]
