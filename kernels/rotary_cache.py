"""Rotary embedding fused with the KV-cache write: one launch per layer instead of two.

Mirrors vLLM's fused RoPE + KV-cache update (vllm/compilation/passes/fusion
fuse_qk_norm_rope_kvcache's rope-and-cache part; the unfused pair is
ops.rotary_embedding + triton_reshape_and_cache_flash). One program per token: q's heads
are rotated in place (NeoX rotate-half over the first rotary_dim features), k's heads are
rotated in registers and written with v straight into the paged cache at the token's slot
(slot < 0, vLLM's PAD_SLOT_ID, is not written). `key` itself is left unrotated: attention
reads keys from the cache only. Arithmetic as kernels/rotary.py: fp32 products of the fp32
cos/sin table, one rounding to the cache dtype.

Preconditions as kernels/rotary.py and kernels/reshape_and_cache.py: positions <
cos_sin_cache.shape[0], slots < num_blocks * block_size.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import check, check_float, check_same_device, next_pow2, pdl_launch, pdl_wait
from kernels.reshape_and_cache import reshape_and_cache_ref
from kernels.rotary import (
    _check_cos_sin_cache,
    _check_positions,
    _heads_view,
    _rotate_heads,
    rotary_embedding_ref,
)


@triton.jit
def _rotary_embedding_and_cache_kernel(
    pos_ptr, slot_ptr, q_ptr, k_ptr, v_ptr, cos_sin_ptr, cache_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kv: tl.int64, stride_block: tl.int64, stride_slot: tl.int64, stride_head,
    n_q_heads, n_k_heads, head_size, half, stride_cos, block_size,
    BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_D: tl.constexpr,
    HEAD_PAD: tl.constexpr, USE_PDL: tl.constexpr,
):
    if USE_PDL:  # the kernel before wrote this one's inputs
        pdl_wait()
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    dq = tl.arange(0, BLOCK_D)[None, :]
    cos = tl.load(cos_sin_ptr + pos * stride_cos + dq, mask=dq < half, other=0.0)
    sin = tl.load(cos_sin_ptr + pos * stride_cos + half + dq, mask=dq < half, other=0.0)
    _rotate_heads(q_ptr + tok * stride_qt, stride_qh, n_q_heads, cos, sin, half, BLOCK_HQ,
                  BLOCK_D)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    if slot < 0:
        return
    # k, v heads [BLOCK_HK, HEAD_PAD]: feature d pairs with d + half (first half) or
    # d - half (second half of the rotary part); features past 2 * half stay as they are
    h = tl.arange(0, BLOCK_HK)[:, None]
    d = tl.arange(0, HEAD_PAD)[None, :]
    mask = (h < n_k_heads) & (d < head_size)
    rot = d < 2 * half
    first = d < half
    j = tl.where(first, d, d - half)
    k_row = k_ptr + tok * stride_kt + h * stride_kh
    x = tl.load(k_row + d, mask=mask, other=0.0)
    xp = tl.load(k_row + tl.where(first, d + half, d - half), mask=mask & rot, other=0.0)
    c = tl.load(cos_sin_ptr + pos * stride_cos + j, mask=rot, other=1.0)
    s = tl.load(cos_sin_ptr + pos * stride_cos + half + j, mask=rot, other=0.0)
    xf, xpf = x.to(tl.float32), xp.to(tl.float32)
    k_rot = tl.where(first, xf * c - xpf * s, xf * c + xpf * s)
    v = tl.load(v_ptr + tok * stride_vt + h * stride_vh + d, mask=mask, other=0.0)
    dst = cache_ptr + (slot // block_size) * stride_block + (slot % block_size) * stride_slot \
        + h * stride_head + d
    # rounded to the activation dtype first, as the unfused rotary kernel stores k
    tl.store(dst, k_rot.to(x.dtype).to(cache_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + stride_kv, v.to(cache_ptr.dtype.element_ty), mask=mask)


def rotary_embedding_and_cache(
    positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    cos_sin_cache: torch.Tensor, head_size: int, kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Rotate query [T, nq * hs] in place; write rotated key and value [T, nkv * hs] (or
    [T, heads, hs] views) into kv_cache [2, num_blocks, block_size, nkv, hs] at slot_mapping
    [T]. cos_sin_cache: [max_position, rotary_dim] float32, cos then sin halves."""
    n = _check_positions(positions)
    nq, sqt, sqh = _heads_view("query", query, n, head_size)
    nk, skt, skh = _heads_view("key", key, n, head_size)
    nv, svt, svh = _heads_view("value", value, n, head_size)
    rot = _check_cos_sin_cache(cos_sin_cache, head_size)
    check(kv_cache.dim() == 5 and kv_cache.shape[0] == 2 and kv_cache.shape[3] == nk == nv
          and kv_cache.shape[4] == head_size and kv_cache.stride(4) == 1,
          lambda: f"kv_cache must be [2, num_blocks, block_size, {nk}, {head_size}] with a "
          f"contiguous last dimension, got {tuple(kv_cache.shape)}")
    check_float("kv_cache", kv_cache)
    check(slot_mapping.dim() == 1 and slot_mapping.shape[0] == n
          and slot_mapping.dtype in (torch.int32, torch.int64),
          lambda: f"slot_mapping must be a [{n}] int32/int64 tensor")
    check_same_device(positions=positions, query=query, key=key, value=value,
                      cos_sin_cache=cos_sin_cache, kv_cache=kv_cache, slot_mapping=slot_mapping)
    if n == 0:
        return
    _rotary_embedding_and_cache_kernel[(n,)](
        positions, slot_mapping, query, key, value, cos_sin_cache, kv_cache,
        sqt, sqh, skt, skh, svt, svh, kv_cache.stride(0), kv_cache.stride(1),
        kv_cache.stride(2), kv_cache.stride(3), nq, nk, head_size, rot // 2,
        cos_sin_cache.stride(0), kv_cache.shape[2], BLOCK_HQ=next_pow2(nq),
        BLOCK_HK=next_pow2(nk), BLOCK_D=next_pow2(rot // 2),
        HEAD_PAD=next_pow2(head_size), num_warps=4, **pdl_launch(query),
    )


def rotary_embedding_and_cache_ref(
    positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    cos_sin_cache: torch.Tensor, head_size: int, kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> torch.Tensor:
    """The engine's unfused path (RotaryEmbedding.forward_native, then reshape_and_cache
    with padding slots skipped); writes the cache, returns the rotated query."""
    n = positions.shape[0]
    q, k = rotary_embedding_ref(positions, query, key, cos_sin_cache, head_size)
    reshape_and_cache_ref(k.view(n, -1, head_size), value.reshape(n, -1, head_size),
                          kv_cache, slot_mapping)
    return q
