"""Prefix caching for hybrid (Gated DeltaNet) models: vLLM's mamba_cache_mode "align"
(vllm/config/cache.py; vllm/v1/core/single_type_kv_cache_manager.py MambaManager,
vllm/v1/core/kv_cache_coordinator.py HybridKVCacheCoordinator, the scheduler's
block-aligned split in vllm/v1/core/sched/scheduler.py).

A GDN layer's state summarises the whole prefix, so a prefix-cache hit of k attention
blocks is usable only if the state after exactly k blocks was kept. The scheduler ends
prefill chunks on block boundaries (a prompt's last full block boundary gets a step of
its own), and whenever a step ends at token k * block_size it asks the runner to copy the
request's state into a snapshot slot keyed by that block's hash (`mamba_saves` of the
SchedulerOutput). A new request's hit is trimmed to the longest prefix whose last block
has a snapshot (the hybrid coordinator's intersection of the attention and state hits);
the runner starts its state from that snapshot (`NewRequestData.mamba_restore_slot`).
Snapshot slots live in the runner's state pool after the running requests' slots
(engine/worker/mamba_utils.py; vLLM shares the KV block pool instead): prefill states may
recycle the least recently used snapshot, decode-time states only take free slots, so a
small pool keeps prompt prefixes.
"""

from __future__ import annotations

from collections import OrderedDict

from engine.core.kv_cache_utils import BlockHash
from engine.request import Request


class MambaAlignCache:
    def __init__(self, block_size: int, first_slot: int, num_slots: int) -> None:
        assert num_slots > 0, "align mode needs snapshot slots"
        self.block_size = block_size
        self.free_slots = list(range(first_slot + num_slots - 1, first_slot - 1, -1))
        self.slot_of: OrderedDict[BlockHash, int] = OrderedDict()  # LRU: oldest first

    def trim_hit(self, request: Request, num_hit_blocks: int) -> tuple[int, int | None]:
        """(usable hit blocks, snapshot slot to start from): the longest prefix of the
        attention hit whose last block has a saved state."""
        for k in range(num_hit_blocks, 0, -1):
            slot = self.slot_of.get(request.block_hashes[k - 1])
            if slot is not None:
                self.slot_of.move_to_end(request.block_hashes[k - 1])
                return k, slot
        return 0, None

    def align_num_new(self, start: int, num_new: int) -> int:
        """Tokens to schedule from `start`: a prefill chunk ends on a block boundary when
        one lies inside it, so that its state can be kept (decode steps are not split)."""
        aligned = (start + num_new) // self.block_size * self.block_size
        return aligned - start if num_new > 1 and start < aligned < start + num_new \
            else num_new

    def plan_save(self, request: Request, num_new: int) -> int | None:
        """The snapshot slot the runner copies this request's state into after this step
        (a step ending at k * block_size, block k's hash known and not yet kept)."""
        end = request.num_computed_tokens + num_new
        k = end // self.block_size
        if end % self.block_size or k == 0 or k > len(request.block_hashes):
            return None
        h = request.block_hashes[k - 1]
        if h in self.slot_of:
            self.slot_of.move_to_end(h)
            return None
        if self.free_slots:
            slot = self.free_slots.pop()
        elif num_new == 1:  # decode-time states only take free slots
            return None
        else:  # recycle the least recently used snapshot
            _, slot = self.slot_of.popitem(last=False)
        self.slot_of[h] = slot
        return slot

    def reset(self) -> None:
        """Forget every snapshot (reset_prefix_cache)."""
        self.free_slots.extend(self.slot_of.values())
        self.slot_of.clear()
