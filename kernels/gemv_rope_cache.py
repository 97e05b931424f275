"""One-row qkv GEMV with RoPE and the KV-cache write in its epilogue, in Triton.

Batch-1 decode of a Llama-family attention layer (engine/layers/attention.py
Attention.forward_qkv): the qkv projection of the one token (kernels/gemv.py dense_gemv's
work), then NeoX rotate-half RoPE of its q and k heads and the store of k and v into the
paged KV cache at the token's slot (kernels/rotary_cache.py's work), one launch instead of
two. Mirrors vLLM's fused RoPE + KV-cache update (vllm/compilation/passes/fusion
fuse_qk_norm_rope_kvcache's rope-and-cache part) moved one kernel earlier, into the GEMV;
the main loop is kernels/gemv.py's (BN weight rows streamed in BK-wide steps into fp32
[.., BK] accumulators reduced once, weights evict_first, no split K).

Row mapping: rotate-half pairs feature i of a head with feature i + head_size / 2, so a
program owns BN / 2 consecutive features j.. of the first half of one head and the same
features of its second half: two accumulators over two row sets of the weight, rows kept
in the checkpoint's order (q heads, then k heads, then v heads; each row contiguous, so
the loads stay coalesced). The epilogue rounds each output to the activation dtype (the
value the plain GEMV stores; the bias is added in fp32 before), rotates q and k heads with
kernels/rotary_cache.py's arithmetic (fp32 products of the fp32 cos/sin table, one
rounding), stores q heads into q and k, v heads into kv_cache at slot_mapping[0] (a slot
< 0, vLLM's PAD_SLOT_ID, is not written). Full rotary only (rotary_dim == head_size), no
q/k norm: other layers keep the GEMV + rotary_cache pair.

An fp8 cache (float8_e4m3fn) takes k and v through kernels/reshape_and_cache.py's
quantize_kv_value with the layer's k_scale / v_scale (one-element float32 device tensors).

Preconditions as kernels/rotary_cache.py: positions < cos_sin_cache.shape[0], slots <
num_blocks * block_size (checking would need a host sync; the launch is CUDA-graph safe).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from libvllm.kernels._common import (
    check,
    check_same_device,
    next_pow2,
    pdl_launch,
    pdl_wait,
)
from libvllm.kernels.gemv import check_one_row_gemv, dense_gemv_ref
from libvllm.kernels.launch_cache import cached_launch
from libvllm.kernels.launch_configs import GemvConfig
from libvllm.kernels.reshape_and_cache import check_kv_cache_dtype, quantize_kv_value
from libvllm.kernels.rotary import _check_cos_sin_cache, _check_positions
from libvllm.kernels.rotary_cache import rotary_embedding_and_cache_ref


@cached_launch
@triton.jit
def _qkv_gemv_rope_cache_kernel(
    x_ptr, w_ptr, bias_ptr, pos_ptr, slot_ptr, cos_sin_ptr, q_ptr, cache_ptr, k_scale_ptr,
    v_scale_ptr, K,
    n_q_heads, n_kv_heads, stride_cos, stride_kv: tl.int64, stride_block: tl.int64,
    stride_slot: tl.int64, stride_head, block_size,
    HEAD: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr,
    BP: tl.constexpr, BK: tl.constexpr, FP8: tl.constexpr, USE_PDL: tl.constexpr,
):
    if USE_PDL:  # the kernel before wrote this one's inputs
        pdl_wait()
    # one program: features j..j+BP-1 and j+HALF.. of one head (BP rotate-half pairs);
    # x: [K], w rows: [2 * BP, K] (row stride K), head: q heads, then k heads, then v heads
    HALF: tl.constexpr = HEAD // 2
    pid = tl.program_id(0)
    head = pid // (HALF // BP)
    j = (pid % (HALF // BP)) * BP + tl.arange(0, BP)  # [BP] features of the first half
    rows = head * HEAD + j  # [BP] weight rows of the first half; + HALF: the second
    # the token's position, slot and cos/sin, loaded while the weights stream
    pos = tl.load(pos_ptr).to(tl.int64)
    slot = tl.load(slot_ptr).to(tl.int64)
    cos = tl.load(cos_sin_ptr + pos * stride_cos + j)  # [BP] fp32
    sin = tl.load(cos_sin_ptr + pos * stride_cos + HALF + j)
    rk = tl.arange(0, BK)
    acc1 = tl.zeros((BP, BK), dtype=tl.float32)  # first-half rows
    acc2 = tl.zeros((BP, BK), dtype=tl.float32)  # second-half rows
    wp1 = w_ptr + rows[:, None].to(tl.int64) * K + rk[None, :]  # [BP, BK] pointers
    wp2 = wp1 + HALF * K
    xp = x_ptr + rk
    for k in range(0, K, BK):
        if EVEN_K:
            w1 = tl.load(wp1, eviction_policy="evict_first")
            w2 = tl.load(wp2, eviction_policy="evict_first")
            x = tl.load(xp)
        else:
            k_mask = rk < K - k
            w1 = tl.load(wp1, mask=k_mask[None, :], other=0.0, eviction_policy="evict_first")
            w2 = tl.load(wp2, mask=k_mask[None, :], other=0.0, eviction_policy="evict_first")
            x = tl.load(xp, mask=k_mask, other=0.0)
        xf = x.to(tl.float32)[None, :]
        acc1 += w1.to(tl.float32) * xf
        acc2 += w2.to(tl.float32) * xf
        wp1 += BK
        wp2 += BK
        xp += BK
    y1 = tl.sum(acc1, axis=1)  # [BP] fp32
    y2 = tl.sum(acc2, axis=1)
    if HAS_BIAS:
        y1 += tl.load(bias_ptr + rows).to(tl.float32)
        y2 += tl.load(bias_ptr + rows + HALF).to(tl.float32)
    # the plain GEMV's outputs, then rotated as kernels/rotary_cache.py rotates them
    o1 = y1.to(x_ptr.dtype.element_ty)
    o2 = y2.to(x_ptr.dtype.element_ty)
    if head < n_q_heads + n_kv_heads:  # q or k: rotate
        f1, f2 = o1.to(tl.float32), o2.to(tl.float32)
        o1 = (f1 * cos - f2 * sin).to(x_ptr.dtype.element_ty)
        o2 = (f2 * cos + f1 * sin).to(x_ptr.dtype.element_ty)
    if head < n_q_heads:
        tl.store(q_ptr + rows, o1)
        tl.store(q_ptr + rows + HALF, o2)
    elif slot >= 0:
        kv = head - n_q_heads  # k heads 0..nkv-1, then v heads nkv..2 nkv-1
        is_v = kv >= n_kv_heads
        dst = (cache_ptr + (slot // block_size) * stride_block
               + (slot % block_size) * stride_slot + is_v.to(tl.int64) * stride_kv
               + (kv - is_v.to(tl.int32) * n_kv_heads) * stride_head + j)
        if FP8:  # the v or k scale
            scale = tl.where(is_v, tl.load(v_scale_ptr), tl.load(k_scale_ptr))
            tl.store(dst, quantize_kv_value(o1, scale).to(cache_ptr.dtype.element_ty))
            tl.store(dst + HALF, quantize_kv_value(o2, scale).to(cache_ptr.dtype.element_ty))
        else:
            tl.store(dst, o1.to(cache_ptr.dtype.element_ty))
            tl.store(dst + HALF, o2.to(cache_ptr.dtype.element_ty))


def gemv_rope_cache_config(k: int) -> GemvConfig:
    """kernels/gemv.py dense_gemv_config's rule for a qkv weight (k < n: 8 rows of 512-wide
    steps, block_k capped at next_pow2(k), 4 warps, 2 stages): block_n 8 is 4 rope pairs.
    Measured by `python3 examples/bench/kernels.py --only qkv_rope --sweep qkv_rope`."""
    return GemvConfig(8, min(512, next_pow2(k)), 4, 2)


def qkv_gemv_rope_cache(
    x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, positions: torch.Tensor,
    cos_sin_cache: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
    num_q_heads: int, num_kv_heads: int, head_size: int,
    config: GemvConfig | None = None,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """x: [1, K], w: [(nq + 2 nkv) * hs, K] (q, k, v rows), bias: [(nq + 2 nkv) * hs] or
    None, positions: [1], cos_sin_cache: [max_position, hs] float32 (cos then sin halves),
    kv_cache: [2, num_blocks, block_size, nkv, hs], slot_mapping: [1] -> q: [1, nq * hs] in
    x's dtype, rotated; k (rotated) and v written into kv_cache at slot_mapping[0].
    config: for sweeps, block_n / 2 dividing hs / 2; None: gemv_rope_cache_config's (with
    fewer pairs when hs / 2 needs it). k_scale, v_scale: [1]
    float32, the quantization scales of an fp8 kv_cache."""
    nq, nkv, hs = num_q_heads, num_kv_heads, head_size
    check(nq > 0 and nkv > 0 and hs > 0 and hs % 2 == 0, lambda: f"need q and kv heads and an "
          f"even head_size, got {nq} q, {nkv} kv heads of {hs}")
    k, _ = check_one_row_gemv(x, w, bias, n=(nq + 2 * nkv) * hs)  # w rows: q, k, v heads
    check(_check_positions(positions) == 1, "positions must hold one token's position")
    rot = _check_cos_sin_cache(cos_sin_cache, hs)
    check(rot == hs, lambda: f"rotary_dim {rot} must be head_size {hs} (full rotary)")
    check(kv_cache.dim() == 5 and kv_cache.shape[0] == 2 and kv_cache.shape[3] == nkv
          and kv_cache.shape[4] == hs and kv_cache.stride(4) == 1,
          lambda: f"kv_cache must be [2, num_blocks, block_size, {nkv}, {hs}] with a "
          f"contiguous last dimension, got {tuple(kv_cache.shape)}")
    fp8 = check_kv_cache_dtype(kv_cache, k_scale, v_scale)
    check(slot_mapping.shape == (1,) and slot_mapping.dtype in (torch.int32, torch.int64),
          "slot_mapping must be a [1] int32/int64 tensor")
    check_same_device(x=x, positions=positions, cos_sin_cache=cos_sin_cache,
                      kv_cache=kv_cache, slot_mapping=slot_mapping)
    half = hs // 2
    cfg = config or gemv_rope_cache_config(k)
    bn, bk, warps, stages = cfg.block_n, cfg.block_k, cfg.num_warps, cfg.num_stages
    if config is None:
        while half % (bn // 2):
            bn //= 2
    else:
        check(bn >= 2 and bn % 2 == 0 and half % (bn // 2) == 0, lambda: f"BN {bn} must be "
              f"even, BN / 2 dividing head_size / 2 = {half}")
    bp = bn // 2
    q = torch.empty(1, nq * hs, dtype=x.dtype, device=x.device)
    _qkv_gemv_rope_cache_kernel[((nq + 2 * nkv) * (half // bp),)](
        x, w, bias if bias is not None else w, positions, slot_mapping, cos_sin_cache, q,
        kv_cache, k_scale if fp8 else None, v_scale if fp8 else None, k, nq, nkv,
        cos_sin_cache.stride(0), kv_cache.stride(0),
        kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3), kv_cache.shape[2],
        HEAD=hs, HAS_BIAS=bias is not None, EVEN_K=k % bk == 0, BP=bp, BK=bk, FP8=fp8,
        num_warps=warps, num_stages=stages, **pdl_launch(x),
    )
    return q


def qkv_gemv_rope_cache_ref(
    x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, positions: torch.Tensor,
    cos_sin_cache: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
    num_q_heads: int, num_kv_heads: int, head_size: int,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """The unfused path in torch: dense_gemv_ref (F.linear in fp32 rounded to x's dtype),
    split into q, k, v, then rotary_embedding_and_cache_ref; writes the cache, returns q."""
    q, k, v = dense_gemv_ref(x, w, bias).split(
        [num_q_heads * head_size, num_kv_heads * head_size, num_kv_heads * head_size], dim=-1)
    return rotary_embedding_and_cache_ref(positions, q, k, v, cos_sin_cache, head_size,
                                          kv_cache, slot_mapping, k_scale=k_scale,
                                          v_scale=v_scale)
