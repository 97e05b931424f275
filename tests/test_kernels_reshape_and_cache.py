"""kernels/reshape_and_cache.py against the engine's torch reshape_and_cache.

Oracle: reshape_and_cache_ref = engine/layers/attention.py reshape_and_cache (index_copy
into the [2, num_blocks, block_size, nkv, hd] cache); the copy must be exact. Mirrors vLLM
0.33 tests/kernels/attention/test_cache.py (test_reshape_and_cache_flash: random distinct
slots, then compare the caches) and vLLM's PAD_SLOT_ID = -1 rows being skipped.
"""

from __future__ import annotations

import pytest
import torch
from test_kernels_common import DEVICE, DTYPES, gpu

from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.layers.attention import reshape_and_cache as engine_reshape_and_cache
from libvllm.kernels.reshape_and_cache import reshape_and_cache, reshape_and_cache_ref


def _case(n: int, blocks: int, bs: int, nkv: int, hd: int, dtype, cache_dtype=None):
    torch.manual_seed(0)
    k = torch.randn(n, nkv, hd, dtype=dtype, device=DEVICE)
    v = torch.randn(n, nkv, hd, dtype=dtype, device=DEVICE)
    cache = torch.randn(2, blocks, bs, nkv, hd, dtype=cache_dtype or dtype, device=DEVICE)
    slots = torch.randperm(blocks * bs, device=DEVICE)[:n]
    return k, v, cache, slots


@pytest.mark.parametrize("n,blocks,bs,nkv,hd", [(7, 4, 4, 2, 16), (20, 8, 16, 1, 40)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_reshape_and_cache_matches_engine(n, blocks, bs, nkv, hd, dtype) -> None:
    k, v, cache, slots = _case(n, blocks, bs, nkv, hd, dtype)
    expected = cache.clone()
    reshape_and_cache_ref(k, v, expected, slots)
    reshape_and_cache(k, v, cache, slots.to(torch.int32))
    assert torch.equal(cache, expected)


def test_padding_slots_are_skipped_and_dtype_cast() -> None:
    k, v, cache, slots = _case(6, 4, 4, 2, 8, torch.float32, cache_dtype=torch.float16)
    slots[[1, 4]] = -1
    expected = cache.clone()
    reshape_and_cache_ref(k, v, expected, slots)
    reshape_and_cache(k, v, cache, slots)
    assert torch.equal(cache, expected)


def test_reshape_and_cache_rejects_bad_input() -> None:
    k, v, cache, slots = _case(3, 2, 4, 2, 8, torch.float32)
    with pytest.raises(InvalidArgumentError, match="kv_cache must be"):
        reshape_and_cache(k, v, cache[0], slots)
    with pytest.raises(InvalidArgumentError, match=r"value must be \[3, 2, 8\]"):
        reshape_and_cache(k, v[:2], cache, slots)
    with pytest.raises(InvalidArgumentError, match="slot_mapping must be"):
        reshape_and_cache(k, v, cache, slots.float())


@gpu
def test_reshape_and_cache_64bit_offsets() -> None:
    # one layer's cache of 2 * 33000 * 16 * 8 * 256 > 2^31 elements (4.3 GB in bf16)
    blocks, bs, nkv, hd = 33000, 16, 8, 256
    cache = torch.zeros(2, blocks, bs, nkv, hd, dtype=torch.bfloat16, device="cuda")
    assert cache.numel() > 2**31
    k = torch.randn(3, nkv, hd, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(3, nkv, hd, dtype=torch.bfloat16, device="cuda")
    slots = torch.tensor([blocks * bs - 1, 5, (blocks - 2) * bs], device="cuda")
    reshape_and_cache(k, v, cache, slots)
    flat = cache.view(2, blocks * bs, nkv, hd)
    assert torch.equal(flat[0, slots], k) and torch.equal(flat[1, slots], v)
    assert int(flat.count_nonzero()) == int(k.count_nonzero() + v.count_nonzero())


def test_reshape_and_cache_ref_is_the_engine_torch_path() -> None:
    """The kernel's plain-torch reference equals engine/layers/attention.py's path."""
    k, v, cache, slots = _case(9, 4, 4, 2, 8, torch.float32, cache_dtype=torch.float16)
    slots[[0, 5]] = -1
    expected = cache.clone()
    keep = slots >= 0
    engine_reshape_and_cache(k[keep], v[keep], expected, slots[keep].long())
    reshape_and_cache_ref(k, v, cache, slots)
    assert torch.equal(cache, expected)
