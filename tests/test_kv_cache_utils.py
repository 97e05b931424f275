"""KV cache building blocks: KVCacheBlock, FreeKVCacheBlockQueue, block hashing, metrics.

Mirrors vLLM 0.33 tests/v1/core/test_kv_cache_utils.py, re-expressed for our API
(single KV cache group, sha256 over a fixed byte layout instead of a pickle, see
.agents/ledger.md). Oracle: the upstream expectations (free-list links, hit rates), and
for hashes an independent re-derivation of the documented byte layout with hashlib.
Multimodal, LoRA, prompt-embeds and KV-group cases are skipped: those inputs do not exist
in this engine.
"""

from __future__ import annotations

import hashlib
import struct

import pytest

from libvllm.engine.core import kv_cache_utils
from libvllm.engine.core.kv_cache_utils import (
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    generate_block_hash_extra_keys,
    hash_block_tokens,
)
from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.metrics import CachingMetrics, PrefixCacheStats
from libvllm.engine.request import Request
from libvllm.engine.sampling_params import SamplingParams

NO_INPUT = "this engine has no multimodal / LoRA / prompt-embeds inputs (not built)"


def make_request(request_id: str, prompt_token_ids: list[int], block_size: int = 3,
                 cache_salt: str | None = None) -> Request:
    return Request(request_id, prompt_token_ids, SamplingParams(max_tokens=17),
                   eos_token_id=100, arrival_time=0.0, block_size=block_size,
                   cache_salt=cache_salt)


def _enc(value) -> bytes:
    """Independent re-derivation of the documented extra-key encoding."""
    if isinstance(value, str):
        raw = value.encode()
        return b"s" + struct.pack("<I", len(raw)) + raw
    if isinstance(value, int):
        return b"i" + struct.pack("<q", value)
    return b"t" + struct.pack("<I", len(value)) + b"".join(_enc(v) for v in value)


def _expected_hash(parent: bytes, tokens, extra_keys=None) -> bytes:
    h = hashlib.sha256(parent)
    h.update(struct.pack(f"<Q{len(tokens)}q", len(tokens), *tokens))
    h.update(b"" if extra_keys is None else _enc(tuple(extra_keys)))
    return h.digest()


@pytest.fixture
def restore_none_hash():
    yield
    kv_cache_utils.init_none_hash()


def test_none_hash(monkeypatch, restore_none_hash):
    # case 1: PYTHONHASHSEED unset -> the fixed default seed (same in every process).
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    kv_cache_utils.init_none_hash()
    none_hash = kv_cache_utils.NONE_HASH
    assert isinstance(none_hash, bytes) and none_hash != b""
    assert kv_cache_utils.resolve_none_hash_seed() == kv_cache_utils.DEFAULT_NONE_HASH_SEED
    assert none_hash == hashlib.sha256(b"vllm-none-hash").digest()
    kv_cache_utils.init_none_hash()
    assert kv_cache_utils.NONE_HASH == none_hash
    # case 2: PYTHONHASHSEED set -> that seed.
    monkeypatch.setenv("PYTHONHASHSEED", "python hash seed")
    kv_cache_utils.init_none_hash()
    assert kv_cache_utils.NONE_HASH == hashlib.sha256(b"python hash seed").digest()


def test_kv_cache_block():
    block = KVCacheBlock(block_id=0)
    assert block.block_id == 0
    assert block.ref_cnt == 0
    assert block.block_hash is None
    block.ref_cnt += 1
    assert block.ref_cnt == 1
    block.ref_cnt -= 1
    assert block.ref_cnt == 0
    block.set_block_hash(b"abc")
    assert block.block_hash == b"abc"
    with pytest.raises(AssertionError):
        block.set_block_hash(b"def")
    block.reset_hash()
    assert block.block_hash is None


def test_kv_cache_block_uses_slots():
    block = KVCacheBlock(block_id=0)
    assert not hasattr(block, "__dict__")
    with pytest.raises(AttributeError):
        block.unexpected_field = True


def test_free_kv_cache_block_queue_initialization():
    block = KVCacheBlock(block_id=0)
    queue = FreeKVCacheBlockQueue([block])
    assert queue.num_free_blocks == 1
    assert queue.fake_free_list_head.next_free_block is block
    assert queue.fake_free_list_tail.prev_free_block is block


def test_free_kv_cache_block_queue_operations():
    blocks = [KVCacheBlock(block_id=i) for i in range(5)]
    queue = FreeKVCacheBlockQueue(blocks)
    assert queue.num_free_blocks == 5
    assert queue.fake_free_list_head.next_free_block is blocks[0]
    assert queue.fake_free_list_tail.prev_free_block is blocks[4]

    block1 = queue.popleft()
    assert block1 == blocks[0]
    assert queue.num_free_blocks == 4
    assert queue.fake_free_list_head.next_free_block is blocks[1]
    assert queue.fake_free_list_tail.prev_free_block is blocks[4]

    queue.remove(blocks[2])
    assert queue.num_free_blocks == 3
    assert blocks[1].next_free_block is blocks[3]
    assert blocks[3].prev_free_block is blocks[1]

    queue.append(blocks[2])
    assert queue.num_free_blocks == 4
    assert queue.fake_free_list_tail.prev_free_block is blocks[2]
    assert blocks[2].prev_free_block is blocks[4]
    assert blocks[2].next_free_block is queue.fake_free_list_tail

    for _ in range(4):
        queue.popleft()
    assert queue.num_free_blocks == 0
    assert queue.fake_free_list_head.next_free_block is queue.fake_free_list_tail
    assert queue.fake_free_list_tail.prev_free_block is queue.fake_free_list_head
    with pytest.raises(ValueError) as e:
        queue.popleft()
    assert str(e.value) == "No free blocks available"


def test_free_kv_cache_block_queue_remove_invalid_block():
    queue = FreeKVCacheBlockQueue([KVCacheBlock(0)])
    with pytest.raises(RuntimeError, match="remove\\(\\) called on an invalid block"):
        queue.remove(KVCacheBlock(1))


def _chain(queue: FreeKVCacheBlockQueue) -> list[int]:
    """Block ids walking forward, checked against the backward links."""
    ids, prev, cur = [], queue.fake_free_list_head, queue.fake_free_list_head.next_free_block
    while cur is not queue.fake_free_list_tail:
        assert cur.prev_free_block is prev
        ids.append(cur.block_id)
        prev, cur = cur, cur.next_free_block
    assert queue.fake_free_list_tail.prev_free_block is prev
    return ids


def test_free_kv_cache_block_queue_append_n():
    queue = FreeKVCacheBlockQueue([])
    blocks = [KVCacheBlock(block_id=i) for i in range(6)]
    queue.append_n([])
    assert queue.num_free_blocks == 0
    assert _chain(queue) == []
    queue.append_n(blocks[0:1])
    assert queue.num_free_blocks == 1
    assert _chain(queue) == [0]
    queue.append_n(blocks[4:6])
    assert queue.num_free_blocks == 3
    assert _chain(queue) == [0, 4, 5]
    queue.append_n(blocks[1:4])
    assert queue.num_free_blocks == 6
    assert _chain(queue) == [0, 4, 5, 1, 2, 3]

    invalid_queue = FreeKVCacheBlockQueue([])
    invalid_queue.fake_free_list_tail.prev_free_block = None
    with pytest.raises(AssertionError):
        invalid_queue.append_n(blocks[0:1])
    assert invalid_queue.num_free_blocks == 0
    assert invalid_queue.fake_free_list_head.next_free_block is invalid_queue.fake_free_list_tail


def test_free_kv_cache_block_queue_prepend_n():
    blocks = [KVCacheBlock(block_id=i) for i in range(6)]
    queue = FreeKVCacheBlockQueue(blocks[0:1])
    queue.prepend_n([])
    assert queue.num_free_blocks == 1
    assert queue.fake_free_list_head.next_free_block is blocks[0]
    queue.prepend_n(blocks[4:6])
    assert queue.num_free_blocks == 3
    assert _chain(queue) == [4, 5, 0]
    queue.prepend_n(blocks[1:3])
    assert queue.num_free_blocks == 5
    assert _chain(queue) == [1, 2, 4, 5, 0]
    assert [queue.popleft().block_id for _ in range(5)] == [1, 2, 4, 5, 0]
    assert queue.num_free_blocks == 0


def test_free_kv_cache_block_queue_popleft_n():
    blocks = [KVCacheBlock(block_id=i) for i in range(6)]
    queue = FreeKVCacheBlockQueue([blocks[1], blocks[3], blocks[5], blocks[4], blocks[0],
                                   blocks[2]])
    assert queue.num_free_blocks == 6
    assert _chain(queue) == [1, 3, 5, 4, 0, 2]
    assert len(queue.popleft_n(0)) == 0
    assert queue.num_free_blocks == 6
    result = queue.popleft_n(1)
    assert queue.num_free_blocks == 5
    assert result == [blocks[1]]
    result += queue.popleft_n(2)
    assert queue.num_free_blocks == 3
    assert result[1:] == [blocks[3], blocks[5]]
    result += queue.popleft_n(3)
    assert queue.num_free_blocks == 0
    assert result[3:] == [blocks[4], blocks[0], blocks[2]]
    for block in result:
        assert block.prev_free_block is None and block.next_free_block is None
    assert _chain(queue) == []


@pytest.mark.parametrize("num_blocks", [1, 2, 16])
def test_free_kv_cache_block_queue_popleft_n_drain_and_refill(num_blocks):
    blocks = [KVCacheBlock(block_id=i) for i in range(num_blocks)]
    queue = FreeKVCacheBlockQueue(blocks)
    assert queue.popleft_n(num_blocks) == blocks
    assert queue.num_free_blocks == 0
    assert queue.fake_free_list_head.next_free_block is queue.fake_free_list_tail
    assert queue.fake_free_list_tail.prev_free_block is queue.fake_free_list_head
    assert all(b.prev_free_block is None and b.next_free_block is None for b in blocks)
    assert queue.popleft_n(0) == []
    queue.append_n(blocks)
    assert queue.popleft_n(num_blocks) == blocks
    assert queue.num_free_blocks == 0


def test_free_kv_cache_block_queue_get_all_free_blocks():
    blocks = [KVCacheBlock(block_id=i) for i in range(5)]
    queue = FreeKVCacheBlockQueue(blocks)
    assert queue.get_all_free_blocks() == blocks
    queue.popleft()
    assert queue.get_all_free_blocks() == blocks[1:]
    queue.remove(blocks[2])
    assert queue.get_all_free_blocks() == blocks[1:2] + blocks[3:]
    queue.append(blocks[2])
    assert queue.get_all_free_blocks() == blocks[1:2] + blocks[3:] + [blocks[2]]


@pytest.mark.skip(reason=NO_INPUT)
def test_generate_block_hash_extra_keys():
    """Upstream: ("mm", identifier, offset) keys for multimodal placeholders."""


def test_generate_block_hash_extra_keys_no_mm_inputs():
    request = make_request("0", list(range(6)))
    assert generate_block_hash_extra_keys(request, 0, 5) is None


def test_generate_block_hash_extra_keys_cache_salt():
    request = make_request("0", list(range(6)), cache_salt="salt")
    # the salt keys the block that starts at token 0 only
    assert generate_block_hash_extra_keys(request, 0, 1) == (("cache_salt", "salt"),)
    assert generate_block_hash_extra_keys(request, 0, 10) == (("cache_salt", "salt"),)
    assert generate_block_hash_extra_keys(request, 1, 2) is None
    assert generate_block_hash_extra_keys(request, 6, 10) is None


@pytest.mark.skip(reason=NO_INPUT)
def test_generate_block_hash_extra_keys_lora():
    """Upstream: ("lora", name, path) keys on every block."""


@pytest.mark.skip(reason=NO_INPUT)
def test_generate_block_hash_extra_keys_prompt_embeds():
    """Upstream: ("prompt_embeds", sha256 of the block's embeddings) keys."""


def test_hash_block_tokens():
    parent_block_hash = b"123"
    curr_block_token_ids = (1, 2, 3)
    extra_keys = ("key1", "key2")
    block_hash = hash_block_tokens(parent_block_hash, curr_block_token_ids, extra_keys)
    assert block_hash == _expected_hash(parent_block_hash, curr_block_token_ids, extra_keys)
    # no parent -> NONE_HASH; extra keys and token boundaries change the hash
    assert hash_block_tokens(None, (1, 2, 3)) == _expected_hash(kv_cache_utils.NONE_HASH,
                                                                (1, 2, 3))
    assert hash_block_tokens(None, (1, 2, 3)) != hash_block_tokens(None, (1, 2, 3), ("k",))
    assert hash_block_tokens(None, (1, 2)) != hash_block_tokens(None, (1, 2, 0))
    assert hash_block_tokens(None, (1,), (("a", "b"),)) != hash_block_tokens(
        None, (1,), ("a", "b"))


def test_hash_block_tokens_rejects_out_of_range_token():
    with pytest.raises(struct.error):
        hash_block_tokens(None, (2**63,))


def test_hash_request_tokens_no_mm_inputs():
    request = make_request("0", list(range(6)), block_size=3)
    block_hashes = request.block_hashes
    assert len(block_hashes) == 2
    assert block_hashes[0] == _expected_hash(kv_cache_utils.NONE_HASH, (0, 1, 2))
    assert block_hashes[1] == _expected_hash(block_hashes[0], (3, 4, 5))


def test_request_block_hasher_extends_on_append():
    request = make_request("0", list(range(5)), block_size=3)
    assert len(request.block_hashes) == 1
    request.append_output_token_ids(5)
    assert len(request.block_hashes) == 2
    assert request.block_hashes[1] == _expected_hash(request.block_hashes[0], (3, 4, 5))
    request.append_output_token_ids([6, 7])
    assert len(request.block_hashes) == 2  # third block not full yet


@pytest.mark.skip(reason=NO_INPUT)
def test_request_block_hasher():
    """Upstream: block hashes of a request with multimodal placeholders."""


@pytest.mark.parametrize("salt", ["", "a" * 129, "a/b", "a@b", "a\\b", "a\x00b", 5])
def test_invalid_cache_salt_is_rejected(salt):
    """vllm/entrypoints/generate/base/protocol.py::validate_cache_salt."""
    with pytest.raises(InvalidArgumentError, match="Parameter 'cache_salt' must"):
        make_request("0", [1, 2, 3], cache_salt=salt)


def _stats(requests: int, queries: int, hits: int) -> PrefixCacheStats:
    return PrefixCacheStats(requests=requests, queries=queries, hits=hits)


def test_metrics_empty_distinguishes_no_queries_from_no_hits():
    metrics = CachingMetrics(max_recent_requests=5)
    assert metrics.empty
    assert metrics.hit_rate == 0.0
    metrics.observe(_stats(1, 20, 0))
    assert not metrics.empty
    assert metrics.hit_rate == 0.0


def test_metrics():
    metrics = CachingMetrics(max_recent_requests=5)
    assert metrics.hit_rate == 0.0
    metrics.observe(_stats(1, 20, 9))
    assert metrics.hit_rate == 0.45
    metrics.observe(_stats(4, 80, 16))
    assert metrics.hit_rate == 0.25
    metrics.observe(_stats(1, 10, 2))
    # (20, 9) dropped, (10, 2) added: 18 / 90
    assert metrics.aggregated_requests == 5
    assert metrics.aggregated_query_total == 90
    assert metrics.aggregated_query_hit == 18
    assert metrics.hit_rate == 0.2
    metrics.reset()
    assert metrics.hit_rate == 0.0
    assert metrics.aggregated_requests == 0
    assert metrics.aggregated_query_total == 0
    assert metrics.aggregated_query_hit == 0
    assert not metrics.query_queue


def test_metrics_empty_stats():
    metrics = CachingMetrics(max_recent_requests=5)
    for s in [(0, 0, 0), (1, 20, 9), (0, 0, 0), (4, 80, 16), (0, 0, 0), (1, 10, 2)]:
        metrics.observe(_stats(*s))
    assert metrics.aggregated_requests == 5
    assert metrics.aggregated_query_total == 90
    assert metrics.aggregated_query_hit == 18
    assert metrics.hit_rate == 0.2
    # only the latest stats are kept when they alone exceed the window
    metrics.observe(_stats(11, 20, 10))
    assert (metrics.aggregated_requests, metrics.aggregated_query_total,
            metrics.aggregated_query_hit) == (11, 20, 10)
    assert metrics.hit_rate == 0.5
    metrics.observe(_stats(22, 40, 30))
    assert (metrics.aggregated_requests, metrics.aggregated_query_total,
            metrics.aggregated_query_hit) == (22, 40, 30)
    assert metrics.hit_rate == 0.75


def test_metrics_reset_flag_clears_window():
    metrics = CachingMetrics(max_recent_requests=5)
    metrics.observe(_stats(1, 20, 9))
    metrics.observe(PrefixCacheStats(reset=True, requests=1, queries=10, hits=5))
    assert (metrics.aggregated_requests, metrics.hit_rate) == (1, 0.5)
