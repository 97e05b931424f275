"""KV cache building blocks, as vllm/v1/core/kv_cache_utils.py: KVCacheBlock,
FreeKVCacheBlockQueue (O(1) LRU free list) and the chained block hash.

Block hash: sha256(parent_hash || token ids as int64 LE || extra keys), the same chain
vLLM builds with its default sha256 algorithm (serialization differs; see ledger).
"""

from __future__ import annotations

import hashlib
import struct

BlockHash = bytes


def hash_block_tokens(parent: BlockHash | None, token_ids: list[int],
                      extra_keys: bytes = b"") -> BlockHash:
    h = hashlib.sha256(parent or b"\0" * 32)
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    h.update(extra_keys)
    return h.digest()


class KVCacheBlock:
    __slots__ = ("block_id", "ref_cnt", "block_hash", "prev_free_block", "next_free_block",
                 "is_null")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: BlockHash | None = None  # set once the block is full and cached
        self.prev_free_block: KVCacheBlock | None = None
        self.next_free_block: KVCacheBlock | None = None
        self.is_null = False


class FreeKVCacheBlockQueue:
    """Doubly linked list of free blocks: evict from the front, free to the back.

    Blocks freed together are appended tail-first by the caller so the least
    useful (the end of a sequence) is evicted first, as in vLLM.
    """

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self.num_free_blocks = len(blocks)
        self.fake_free_list_head = KVCacheBlock(-1)
        self.fake_free_list_tail = KVCacheBlock(-1)
        prev = self.fake_free_list_head
        for b in blocks:
            prev.next_free_block, b.prev_free_block = b, prev
            prev = b
        tail = self.fake_free_list_tail
        prev.next_free_block, tail.prev_free_block = tail, prev

    def popleft(self) -> KVCacheBlock:
        b = self.fake_free_list_head.next_free_block
        if b is self.fake_free_list_tail:
            raise ValueError("No free blocks available")
        self.remove(b)
        return b

    def remove(self, b: KVCacheBlock) -> None:
        b.prev_free_block.next_free_block = b.next_free_block
        b.next_free_block.prev_free_block = b.prev_free_block
        b.prev_free_block = b.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, b: KVCacheBlock) -> None:
        last = self.fake_free_list_tail.prev_free_block
        last.next_free_block, b.prev_free_block = b, last
        b.next_free_block, self.fake_free_list_tail.prev_free_block = self.fake_free_list_tail, b
        self.num_free_blocks += 1

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        out, b = [], self.fake_free_list_head.next_free_block
        while b is not self.fake_free_list_tail:
            out.append(b)
            b = b.next_free_block
        return out
