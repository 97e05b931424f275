"""Rotary embedding fused with the KV-cache write: one launch per layer instead of two, and
with Qwen3's per-head q/k RMSNorm folded in, one instead of four.

Mirrors vLLM's fused RoPE + KV-cache update (vllm/compilation/passes/fusion
fuse_qk_norm_rope_kvcache's rope-and-cache part; the unfused pair is
ops.rotary_embedding + triton_reshape_and_cache_flash). Two programs per token, side by
side: one rotates q's heads in place (NeoX rotate-half over the first rotary_dim features),
the other rotates k's heads in registers and writes them with v straight into the paged
cache at the token's slot (slot < 0, vLLM's PAD_SLOT_ID, is not written). `key` itself is
left unrotated: attention reads keys from the cache only. Arithmetic as kernels/rotary.py:
fp32 products of the fp32 cos/sin table, one rounding to the cache dtype.

QK_NORM (q_weight / k_weight given) is vLLM 0.33's csrc/fused_qknorm_rope_cache_kernel.cu
(qknorm_rope_cache_kernel, with norm_weight_bias for the Gemma / Qwen3-Next 1 + w form) and
vllm/model_executor/layers/fused_qk_norm_rope.py: each whole head of q and k is
RMS-normalized first, with the engine's RMSNorm rounding (kernels/rms_norm.py: fp32
statistics and weight product, rounded once to the activation dtype), then rotated as
above; query then holds the normalized, rotated heads (the unrotated tail normalized too).

An fp8 cache (float8_e4m3fn) takes the rotated k (rounded to the activation dtype first,
the value the unfused pair caches) and v through kernels/reshape_and_cache.py's
quantize_kv with the layer's k_scale / v_scale.

Preconditions as kernels/rotary.py and kernels/reshape_and_cache.py: positions <
cos_sin_cache.shape[0], slots < num_blocks * block_size.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from libvllm.kernels._common import (
    check,
    check_float,
    check_same_device,
    next_pow2,
    pdl_launch,
    pdl_wait,
)
from libvllm.kernels.launch_cache import cached_launch
from libvllm.kernels.reshape_and_cache import (
    check_kv_cache_dtype,
    quantize_kv,
    reshape_and_cache_ref,
)
from libvllm.kernels.rms_norm import rms_norm_ref
from libvllm.kernels.rotary import (
    _check_cos_sin_cache,
    _check_positions,
    _heads_view,
    rotary_embedding_ref,
)


@triton.jit
def _norm_rope_store(src, src_stride_h, dst, dst_stride_h, n_heads, head_size, half, cos, sin,
                     w_ptr, eps, weight_offset, scale_ptr, QK_NORM: tl.constexpr,
                     STORE_TAIL: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
                     BLOCK_T: tl.constexpr, FP8: tl.constexpr):
    # src, dst: this token's first head. Each head [head_size] = rotary halves [half] x 2,
    # then an unrotated tail (partial rotary). With QK_NORM the whole head is RMS-normalized
    # (fp32, rounded to src's dtype as RMSNorm's output) before the rotation. dst may be src
    # (q is rotated in place): every load happens before the barrier, every store after
    # it, since a tile smaller than the block's threads is held by several of them.
    # FP8: dst is an fp8 cache row, each stored value quantize_kv'd with scale_ptr.
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    t = 2 * half + tl.arange(0, BLOCK_T)[None, :]
    m = (h < n_heads) & (d < half)  # [BLOCK_H, BLOCK_D]
    mt = (h < n_heads) & (t < head_size)  # [BLOCK_H, BLOCK_T]
    row = src + h * src_stride_h
    x1 = tl.load(row + d, mask=m, other=0.0)
    x2 = tl.load(row + half + d, mask=m, other=0.0)
    xt = tl.load(row + t, mask=mt, other=0.0)
    tl.debug_barrier()
    if QK_NORM:
        f1, f2, ft = x1.to(tl.float32), x2.to(tl.float32), xt.to(tl.float32)
        var = (tl.sum(f1 * f1, axis=1) + tl.sum(f2 * f2, axis=1)
               + tl.sum(ft * ft, axis=1)) / head_size
        r = tl.math.rsqrt(var + eps)[:, None]  # [BLOCK_H, 1]
        w1 = tl.load(w_ptr + d, mask=d < half, other=0.0).to(tl.float32) + weight_offset
        w2 = tl.load(w_ptr + half + d, mask=d < half, other=0.0).to(tl.float32) + weight_offset
        wt = tl.load(w_ptr + t, mask=t < head_size, other=0.0).to(tl.float32) + weight_offset
        x1 = (f1 * r * w1).to(x1.dtype)
        x2 = (f2 * r * w2).to(x1.dtype)
        xt = (ft * r * wt).to(x1.dtype)
    f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
    out = dst + h * dst_stride_h
    # rounded to the activation dtype first, as the unfused rotary kernel stores
    o1 = quantize_kv((f1 * cos - f2 * sin).to(x1.dtype), scale_ptr, FP8)
    o2 = quantize_kv((f2 * cos + f1 * sin).to(x1.dtype), scale_ptr, FP8)
    tl.store(out + d, o1.to(dst.dtype.element_ty), mask=m)
    tl.store(out + half + d, o2.to(dst.dtype.element_ty), mask=m)
    if STORE_TAIL:
        tl.store(out + t, quantize_kv(xt, scale_ptr, FP8).to(dst.dtype.element_ty), mask=mt)


@cached_launch
@triton.jit
def _rotary_embedding_and_cache_kernel(
    pos_ptr, slot_ptr, q_ptr, k_ptr, v_ptr, cos_sin_ptr, cache_ptr, qw_ptr, kw_ptr,
    k_scale_ptr, v_scale_ptr, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kv: tl.int64, stride_block: tl.int64, stride_slot: tl.int64, stride_head,
    n_q_heads, n_k_heads, head_size, half, stride_cos, block_size, eps, weight_offset,
    BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_T: tl.constexpr, HEAD_PAD: tl.constexpr, QK_NORM: tl.constexpr,
    FP8: tl.constexpr, USE_PDL: tl.constexpr,
):
    if USE_PDL:  # the kernel before wrote this one's inputs
        pdl_wait()
    # program (token, part): part 0 rotates the token's q heads, part 1 writes its K and V
    # into the cache; apart, the two dependency chains run side by side
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    dq = tl.arange(0, BLOCK_D)[None, :]
    cos = tl.load(cos_sin_ptr + pos * stride_cos + dq, mask=dq < half, other=0.0)
    sin = tl.load(cos_sin_ptr + pos * stride_cos + half + dq, mask=dq < half, other=0.0)
    if tl.program_id(1) == 0:
        q_row = q_ptr + tok * stride_qt
        # in place; the tail changes only when normalized
        _norm_rope_store(q_row, stride_qh, q_row, stride_qh, n_q_heads, head_size, half, cos,
                         sin, qw_ptr, eps, weight_offset, None, QK_NORM, QK_NORM, BLOCK_HQ,
                         BLOCK_D, BLOCK_T, False)
    else:
        slot = tl.load(slot_ptr + tok).to(tl.int64)
        if slot >= 0:
            dst = (cache_ptr + (slot // block_size) * stride_block
                   + (slot % block_size) * stride_slot)
            _norm_rope_store(k_ptr + tok * stride_kt, stride_kh, dst, stride_head, n_k_heads,
                             head_size, half, cos, sin, kw_ptr, eps, weight_offset, k_scale_ptr,
                             QK_NORM, True, BLOCK_HK, BLOCK_D, BLOCK_T, FP8)
            h = tl.arange(0, BLOCK_HK)[:, None]
            d = tl.arange(0, HEAD_PAD)[None, :]
            mask = (h < n_k_heads) & (d < head_size)  # v heads [BLOCK_HK, HEAD_PAD]
            v = tl.load(v_ptr + tok * stride_vt + h * stride_vh + d, mask=mask, other=0.0)
            v = quantize_kv(v, v_scale_ptr, FP8)
            tl.store(dst + stride_kv + h * stride_head + d, v.to(cache_ptr.dtype.element_ty),
                     mask=mask)


def _check_qk_norm(q_weight: torch.Tensor | None, k_weight: torch.Tensor | None,
                   head_size: int, weight_offset: float) -> None:
    check((q_weight is None) == (k_weight is None), "q_weight and k_weight go together")
    if q_weight is None:
        return
    for name, w in (("q_weight", q_weight), ("k_weight", k_weight)):
        check(w.shape == (head_size,) and w.is_contiguous(),
              lambda name=name, w=w: f"{name} must be [{head_size}], got {tuple(w.shape)}")
        check_float(name, w)
    check(weight_offset in (0.0, 1.0), lambda: f"weight_offset must be 0 or 1, got "
          f"{weight_offset}")


def rotary_embedding_and_cache(
    positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    cos_sin_cache: torch.Tensor, head_size: int, kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor, q_weight: torch.Tensor | None = None,
    k_weight: torch.Tensor | None = None, eps: float = 1e-6, weight_offset: float = 0.0,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
) -> None:
    """Rotate query [T, nq * hs] in place; write rotated key and value [T, nkv * hs] (or
    [T, heads, hs] views) into kv_cache [2, num_blocks, block_size, nkv, hs] at slot_mapping
    [T]. cos_sin_cache: [max_position, rotary_dim] float32, cos then sin halves.
    With q_weight and k_weight [hs] (Qwen3's q_norm / k_norm), each head of q and k is first
    RMS-normalized by x * (w + weight_offset) (1: GemmaRMSNorm) with eps, and query holds
    the normalized, rotated heads. k_scale, v_scale: [1] float32, the quantization scales
    of an fp8 kv_cache."""
    n = _check_positions(positions)
    nq, sqt, sqh = _heads_view("query", query, n, head_size)
    nk, skt, skh = _heads_view("key", key, n, head_size)
    nv, svt, svh = _heads_view("value", value, n, head_size)
    rot = _check_cos_sin_cache(cos_sin_cache, head_size)
    _check_qk_norm(q_weight, k_weight, head_size, weight_offset)
    check(kv_cache.dim() == 5 and kv_cache.shape[0] == 2 and kv_cache.shape[3] == nk == nv
          and kv_cache.shape[4] == head_size and kv_cache.stride(4) == 1,
          lambda: f"kv_cache must be [2, num_blocks, block_size, {nk}, {head_size}] with a "
          f"contiguous last dimension, got {tuple(kv_cache.shape)}")
    fp8 = check_kv_cache_dtype(kv_cache, k_scale, v_scale)
    check(slot_mapping.dim() == 1 and slot_mapping.shape[0] == n
          and slot_mapping.dtype in (torch.int32, torch.int64),
          lambda: f"slot_mapping must be a [{n}] int32/int64 tensor")
    norm = q_weight is not None
    check_same_device(positions=positions, query=query, key=key, value=value,
                      cos_sin_cache=cos_sin_cache, kv_cache=kv_cache, slot_mapping=slot_mapping,
                      **({"q_weight": q_weight, "k_weight": k_weight} if norm else {}))
    if n == 0:
        return
    # the normalized q heads stay in registers: more warps, so that 32 heads of 128 (Qwen3
    # MoE) take ~120 registers a thread and 64 do not spill (ptxas, sm_90, Triton 3.6); the
    # K/V program of a token gets the same count (one launch, one num_warps)
    block_hq, head_pad = next_pow2(nq), next_pow2(head_size)
    num_warps = min(16, max(4, block_hq * head_pad // 512)) if norm else 4
    _rotary_embedding_and_cache_kernel[(n, 2)](
        positions, slot_mapping, query, key, value, cos_sin_cache, kv_cache,
        q_weight if norm else query, k_weight if norm else key,
        k_scale if fp8 else None, v_scale if fp8 else None, sqt, sqh, skt, skh, svt, svh,
        kv_cache.stride(0), kv_cache.stride(1),
        kv_cache.stride(2), kv_cache.stride(3), nq, nk, head_size, rot // 2,
        cos_sin_cache.stride(0), kv_cache.shape[2], float(eps), float(weight_offset),
        BLOCK_HQ=block_hq, BLOCK_HK=next_pow2(nk), BLOCK_D=next_pow2(rot // 2),
        BLOCK_T=next_pow2(head_size - rot), HEAD_PAD=head_pad, QK_NORM=norm, FP8=fp8,
        num_warps=num_warps, **pdl_launch(query),
    )


def rotary_embedding_and_cache_ref(
    positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    cos_sin_cache: torch.Tensor, head_size: int, kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor, q_weight: torch.Tensor | None = None,
    k_weight: torch.Tensor | None = None, eps: float = 1e-6, weight_offset: float = 0.0,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """The engine's unfused path (with weights: RMSNorm.forward_native over each q and k
    head; then RotaryEmbedding.forward_native, then reshape_and_cache with padding slots
    skipped); writes the cache, returns the rotated query."""
    n = positions.shape[0]
    if q_weight is not None:
        query = rms_norm_ref(query.reshape(n, -1, head_size), q_weight, eps,
                             weight_offset=weight_offset)
        key = rms_norm_ref(key.reshape(n, -1, head_size), k_weight, eps,
                           weight_offset=weight_offset)
    q, k = rotary_embedding_ref(positions, query, key, cos_sin_cache, head_size)
    reshape_and_cache_ref(k.view(n, -1, head_size), value.reshape(n, -1, head_size),
                          kv_cache, slot_mapping, k_scale, v_scale)
    return q
