"""Write this step's K/V rows into the paged KV cache at their slots, in Triton.

Mirrors vllm/v1/attention/ops/triton_reshape_and_cache_flash.py (reshape_and_cache_flash, the
NHD layout): one program per (token, tile of heads*head_size) copies its key and value row to
slot = block_id * block_size + offset. The cache is the engine's single tensor
[2, num_blocks, block_size, num_kv_heads, head_size] (engine/layers/attention.py). A negative
slot (vLLM's PAD_SLOT_ID = -1, padding rows of a CUDA-graph batch) is skipped. Offsets are
64-bit: one layer's cache can exceed 2^31 elements.

Precondition: slot_mapping < num_blocks * block_size (the KV cache manager allocates slots).
reshape_and_cache_ref is the engine's torch path (engine/layers/attention.py
reshape_and_cache) in plain torch; tests/test_kernels_reshape_and_cache.py checks they agree.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import (
    cdiv,
    check,
    check_float,
    check_same_device,
    next_pow2,
    pdl_launch,
    pdl_wait,
)
from kernels.launch_cache import cached_launch


@cached_launch
@triton.jit
def _reshape_and_cache_kernel(
    k_ptr, v_ptr, cache_ptr, slot_ptr,
    stride_kt: tl.int64, stride_vt: tl.int64, stride_kv: tl.int64,
    stride_block: tl.int64, stride_slot: tl.int64, row_size, block_size,
    TILE: tl.constexpr, USE_PDL: tl.constexpr,
):
    if USE_PDL:  # the kernel before wrote this one's inputs
        pdl_wait()
    # k, v rows: [num_kv_heads * head_size] (heads contiguous); cache slot rows likewise
    tok = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    if slot < 0:
        return
    cols = tl.program_id(1) * TILE + tl.arange(0, TILE)
    mask = cols < row_size
    dst = cache_ptr + (slot // block_size) * stride_block + (slot % block_size) * stride_slot
    k = tl.load(k_ptr + tok * stride_kt + cols, mask=mask)
    v = tl.load(v_ptr + tok * stride_vt + cols, mask=mask)
    tl.store(dst + cols, k.to(cache_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + stride_kv + cols, v.to(cache_ptr.dtype.element_ty), mask=mask)


def _check_rows(name: str, t: torch.Tensor, n: int, nkv: int, hd: int) -> None:
    check_float(name, t)
    check(t.shape == (n, nkv, hd) and t.stride(2) == 1 and t.stride(1) == hd,
          lambda: f"{name} must be [{n}, {nkv}, {hd}] with contiguous heads, got {tuple(t.shape)} "
          f"strides {t.stride()}")


def reshape_and_cache(
    key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """key, value: [T, nkv, hd]; kv_cache: [2, num_blocks, block_size, nkv, hd]; slots: [T]."""
    check(kv_cache.dim() == 5 and kv_cache.shape[0] == 2,
          lambda: "kv_cache must be [2, num_blocks, "
          f"block_size, num_kv_heads, head_size], got {tuple(kv_cache.shape)}")
    check_float("kv_cache", kv_cache)
    _, _, block_size, nkv, hd = kv_cache.shape
    check(kv_cache.stride(4) == 1 and kv_cache.stride(3) == hd,
          "kv_cache's head and feature dimensions must be contiguous")
    check(slot_mapping.dim() == 1 and slot_mapping.dtype in (torch.int32, torch.int64),
          "slot_mapping must be a 1-D int32/int64 tensor")
    n = slot_mapping.shape[0]
    _check_rows("key", key, n, nkv, hd)
    _check_rows("value", value, n, nkv, hd)
    check_same_device(key=key, value=value, kv_cache=kv_cache, slot_mapping=slot_mapping)
    if n == 0:
        return
    row = nkv * hd
    tile = min(2048, next_pow2(row))
    _reshape_and_cache_kernel[(n, cdiv(row, tile))](
        key, value, kv_cache, slot_mapping, key.stride(0), value.stride(0), kv_cache.stride(0),
        kv_cache.stride(1), kv_cache.stride(2), row, block_size, TILE=tile,
        num_warps=4 if tile >= 512 else 1,
        **pdl_launch(key),
    )


def reshape_and_cache_ref(
    key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """The engine's torch path (engine/layers/attention.py reshape_and_cache), padding skipped:
    key, value [T, nkv, hd] copied into kv_cache [2, num_blocks, block_size, nkv, hd]."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    # by block and offset: the cache may be a strided view of a block pool
    blocks, offsets = slots // kv_cache.shape[2], slots % kv_cache.shape[2]
    kv_cache[0, blocks, offsets] = key[keep].to(kv_cache.dtype)
    kv_cache[1, blocks, offsets] = value[keep].to(kv_cache.dtype)
