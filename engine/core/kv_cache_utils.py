"""KV cache building blocks, as vllm/v1/core/kv_cache_utils.py: the chained block hash,
KVCacheBlock, FreeKVCacheBlockQueue (O(1) LRU free list), and the start-up KV sizing of
vllm/v1/core/kv_cache_planning.py (_check_enough_kv_cache_memory) and its grouping of a
hybrid model's layers into KV cache groups of one page size
(_get_kv_cache_groups_uniform_page_size).

Block hash: sha256(parent hash || token count + token ids as int64 LE || extra keys), the
chain vLLM builds with its default sha256; the first block's parent is NONE_HASH, derived
from PYTHONHASHSEED or vLLM's fixed seed. vLLM pickles the tuple; we serialize with a
fixed tagged layout instead (no pickle; see .agents/ledger.md), so digests differ from
vLLM's bytes but chain and collide identically.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence
from typing import Any, NewType, Protocol

from libvllm.engine import envs
from libvllm.engine.errors import OutOfResourcesError

BlockHash = NewType("BlockHash", bytes)


class HashableRequest(Protocol):
    """What block hashing reads of a request (engine/request.py's Request)."""

    block_hashes: list[BlockHash]
    num_tokens: int
    all_token_ids: list[int]
    cache_salt: str | None


DEFAULT_NONE_HASH_SEED = "vllm-none-hash"
NONE_HASH: BlockHash


def resolve_none_hash_seed() -> str:
    """PYTHONHASHSEED if set, else vLLM's fixed seed for cryptographic hashes."""
    seed = envs.PYTHONHASHSEED
    return DEFAULT_NONE_HASH_SEED if seed is None else seed


def init_none_hash() -> None:
    global NONE_HASH
    NONE_HASH = BlockHash(hashlib.sha256(resolve_none_hash_seed().encode()).digest())


init_none_hash()


def _encode_key(value: Any) -> bytes:
    """Tagged, length-prefixed encoding of str / int / tuple extra keys."""
    if isinstance(value, str):
        raw = value.encode()
        return b"s" + struct.pack("<I", len(raw)) + raw
    if isinstance(value, int):
        return b"i" + struct.pack("<q", value)
    if isinstance(value, tuple):
        return b"t" + struct.pack("<I", len(value)) + b"".join(_encode_key(v) for v in value)
    raise TypeError(f"unsupported block hash extra key {type(value).__name__}")


def hash_block_tokens(parent_block_hash: bytes | None, curr_block_token_ids: Sequence[int],
                      extra_keys: tuple[Any, ...] | None = None) -> BlockHash:
    """Hash of one full block chained to its parent (NONE_HASH for the first block)."""
    n = len(curr_block_token_ids)
    h = hashlib.sha256(parent_block_hash or NONE_HASH)
    h.update(struct.pack(f"<Q{n}q", n, *curr_block_token_ids))
    if extra_keys is not None:
        h.update(_encode_key(tuple(extra_keys)))
    return BlockHash(h.digest())


def generate_block_hash_extra_keys(request: HashableRequest, start_token_idx: int,
                                   end_token_idx: int) -> tuple[Any, ...] | None:
    """Extra keys of the block [start, end): the cache salt keys the first block only.
    (vLLM also adds multimodal, LoRA and prompt-embeds keys; none exist here.)"""
    if start_token_idx == 0 and request.cache_salt:
        return (("cache_salt", request.cache_salt),)
    return None


def get_request_block_hasher(block_size: int) -> Callable[[HashableRequest], list[BlockHash]]:
    """Returns a function computing the hashes of a request's new full blocks."""

    def request_block_hasher(request: HashableRequest) -> list[BlockHash]:
        start = len(request.block_hashes) * block_size
        prev = request.block_hashes[-1] if request.block_hashes else None
        new_hashes: list[BlockHash] = []
        while start + block_size <= request.num_tokens:
            end = start + block_size
            prev = hash_block_tokens(prev, request.all_token_ids[start:end],
                                     generate_block_hash_extra_keys(request, start, end))
            new_hashes.append(prev)
            start = end
        return new_hashes

    return request_block_hasher


class KVCacheBlock:
    """KV cache block metadata; prev/next links belong to FreeKVCacheBlockQueue."""

    __slots__ = ("block_id", "ref_cnt", "_block_hash", "prev_free_block", "next_free_block",
                 "is_null")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self._block_hash: BlockHash | None = None  # set once full and cached
        self.prev_free_block: KVCacheBlock | None = None
        self.next_free_block: KVCacheBlock | None = None
        self.is_null = False  # the null block is never cached nor freed

    @property
    def block_hash(self) -> BlockHash | None:
        return self._block_hash

    def set_block_hash(self, block_hash: BlockHash) -> None:
        assert self._block_hash is None, "The block already has a hash."
        self._block_hash = block_hash

    def reset_hash(self) -> None:
        self._block_hash = None

    def __repr__(self) -> str:
        prev_id = self.prev_free_block.block_id if self.prev_free_block else None
        next_id = self.next_free_block.block_id if self.next_free_block else None
        return (f"KVCacheBlock(block_id={self.block_id}, ref_cnt={self.ref_cnt}, "
                f"block_hash={self._block_hash!r}, prev={prev_id}, next={next_id})")


class FreeKVCacheBlockQueue:
    """Doubly linked list of free blocks between a fake head and tail: evict from the
    front, O(1) removal from the middle. Order: blocks that are not cached first (LIFO,
    prepended), then cached ones least recently used first; the caller frees a
    request's blocks tail-first so a sequence's tail is evicted before its head."""

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self.num_free_blocks = len(blocks)
        self.fake_free_list_head = KVCacheBlock(-1)
        self.fake_free_list_tail = KVCacheBlock(-1)
        prev = self.fake_free_list_head
        for block in blocks:
            prev.next_free_block, block.prev_free_block = block, prev
            prev = block
        prev.next_free_block = self.fake_free_list_tail
        self.fake_free_list_tail.prev_free_block = prev

    def popleft(self) -> KVCacheBlock:
        first = self.fake_free_list_head.next_free_block
        if first is self.fake_free_list_tail or first is None:
            assert self.num_free_blocks == 0, "num_free_blocks is out of sync"
            raise ValueError("No free blocks available")
        self.remove(first)
        return first

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        assert self.num_free_blocks >= n
        out, cur = [], self.fake_free_list_head.next_free_block
        for _ in range(n):
            nxt = cur.next_free_block
            cur.prev_free_block = cur.next_free_block = None
            out.append(cur)
            cur = nxt
        self.fake_free_list_head.next_free_block, cur.prev_free_block = \
            cur, self.fake_free_list_head
        self.num_free_blocks -= n
        return out

    def remove(self, block: KVCacheBlock) -> None:
        prev, nxt = block.prev_free_block, block.next_free_block
        if prev is None or nxt is None:
            raise RuntimeError(f"remove() called on an invalid block: {block}")
        prev.next_free_block, nxt.prev_free_block = nxt, prev
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        self.append_n([block])

    def append_n(self, blocks: list[KVCacheBlock]) -> None:
        if not blocks:
            return
        tail = self.fake_free_list_tail
        last = tail.prev_free_block
        assert last is not None, "prev_free_block of fake_free_list_tail should always exist"
        for block in blocks:
            block.prev_free_block, last.next_free_block = last, block
            last = block
        last.next_free_block, tail.prev_free_block = tail, last
        self.num_free_blocks += len(blocks)

    def prepend_n(self, blocks: list[KVCacheBlock]) -> None:
        if not blocks:
            return
        first = self.fake_free_list_head.next_free_block
        assert first is not None, "next_free_block of fake_free_list_head should always exist"
        prev = self.fake_free_list_head
        for block in blocks:
            block.prev_free_block, prev.next_free_block = prev, block
            prev = block
        prev.next_free_block, first.prev_free_block = first, prev
        self.num_free_blocks += len(blocks)

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        out, cur = [], self.fake_free_list_head.next_free_block
        while cur is not self.fake_free_list_tail:
            out.append(cur)
            cur = cur.next_free_block
        return out


def _gib(num_bytes: int) -> str:
    return f"{round(num_bytes / (1 << 30), 2)}"  # vllm/utils/mem_utils.py::format_gib


def get_num_kv_blocks(available_memory: int, block_bytes: int, block_size: int,
                      max_model_len: int, state_blocks: int = 0) -> int:
    """Blocks `available_memory` buys (block 0 becomes the null block); fails fast, with
    vLLM's wording, when one request of max_model_len (and its `state_blocks` hybrid state
    blocks) cannot fit."""
    if available_memory <= 0:
        raise OutOfResourcesError(
            "No available memory for the cache blocks. Try increasing "
            "`gpu_memory_utilization` when initializing the engine.")
    num_blocks = available_memory // block_bytes
    needed_blocks = -(-max_model_len // block_size) + state_blocks + 1  # + the null block
    if num_blocks < needed_blocks:
        estimated = max(num_blocks - 1, 0) * block_size
        estimated_msg = (f"Based on the available memory, the estimated maximum model "
                         f"length is {estimated}. " if estimated > 0 else "")
        raise OutOfResourcesError(
            f"To serve at least one request with the model's max seq len ({max_model_len}), "
            f"({_gib(needed_blocks * block_bytes)} GiB KV cache is needed, which is larger "
            f"than the available KV cache memory ({_gib(available_memory)} GiB). "
            f"{estimated_msg}Try increasing `kv_cache_memory_bytes` or decreasing "
            f"`max_model_len` when initializing the engine.")
    return num_blocks


def group_hybrid_layers(num_attn_layers: int, num_mamba_layers: int
                        ) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]:
    """(attention groups, mamba groups) as _get_kv_cache_groups_uniform_page_size: the
    group size is the smaller layer count (the larger one when below 1.5x of it), layer
    i of a kind goes to group i % num_groups of that kind; a short group is padded."""
    counts = (num_attn_layers, num_mamba_layers)
    group_size = min(counts)
    if max(counts) < group_size * 1.5:
        group_size = max(counts)

    def split(n: int) -> tuple[tuple[int, ...], ...]:
        num_groups = -(-n // group_size)
        return tuple(tuple(range(i, n, num_groups)) for i in range(num_groups))

    attn, mamba = split(num_attn_layers), split(num_mamba_layers)
    attn = tuple(g + (-1,) * (group_size - len(g)) for g in attn)  # -1: padding layer
    mamba = tuple(g + (-1,) * (group_size - len(g)) for g in mamba)
    return attn, mamba
