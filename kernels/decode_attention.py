"""Paged decode attention in Triton: one query token per request, split-KV (flash-decoding),
optionally with this step's RoPE and KV-cache write done by the same launch.

Mirrors vllm/v1/attention/ops/triton_decode_attention.py (grouped split-KV decode: a
program per (request, kv head, split) holds the kv head's `group` query heads in the rows
of one tile; stage 2 merges the splits, here kernels/paged_attention.py's reduce kernel).
Layout and metadata as kernels/paged_attention.py (the engine's, engine/layers/attention.py).

With `key` given (vLLM fuses RoPE with the KV-cache update in a kernel of its own,
vllm/compilation/passes/fusion fuse_qk_norm_rope_kvcache; at batch 1 that kernel is a
launch and a gap per layer): q is rotated in registers (NeoX rotate-half over rotary_dim
= cos_sin_cache.shape[1], q in memory untouched), and the program that owns the KV tile of
the new token (the last split with work) rotates the token's key, writes it and the value
at slot_mapping (PAD_SLOT_ID -1 writes nothing), then passes a CTA barrier before reading
that tile; no other program reads that tile. Arithmetic as kernels/rotary_cache.py: fp32
products of the fp32 table, one rounding to the activation dtype, then the cache dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import check, check_same_device, next_pow2, pdl_launch, pdl_wait
from kernels.paged_attention import (
    LOG2E,
    _attend_tiles,
    _check_cache,
    _check_window,
    _gate,
    _kv_splits,
    _out,
    _paged_attention_decode_reduce_kernel,
    _splits_pad,
    _store_out,
    _tile_n,
    paged_attention_prefill_ref,
)
from kernels.rotary import _check_cos_sin_cache, _check_positions, _heads_view


@triton.jit
def _rope(x_ptr, d, mask, cos, sin, partner):
    """x [.., HEAD_PAD] rotated (NeoX): x * cos + x[partner] * sin, where sin is negated on the
    first half and cos 1 / sin 0 past rotary_dim; fp32, rounded to x's dtype."""
    x = tl.load(x_ptr + d, mask=mask, other=0.0)
    xp = tl.load(x_ptr + partner, mask=mask, other=0.0)
    return (x.to(tl.float32) * cos + xp.to(tl.float32) * sin).to(x.dtype)


@triton.jit(do_not_specialize=["num_splits"])  # one compile for every split count
def _paged_attention_decode_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, seq_lens_ptr, out_ptr, part_acc_ptr, part_ml_ptr, gate_ptr,
    kn_ptr, vn_ptr, pos_ptr, slot_ptr, cos_sin_ptr,
    stride_qt: tl.int64, stride_qh, stride_bt: tl.int64, stride_block: tl.int64,
    stride_slot: tl.int64, stride_head, stride_ot: tl.int64, stride_oh, stride_gt: tl.int64,
    stride_gh, stride_knt: tl.int64, stride_knh, stride_vnt: tl.int64, stride_vnh, stride_cos,
    num_q_heads, head_size, group, qk_scale, num_splits, window, half,
    BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr, HEAD_PAD: tl.constexpr,
    BLOCK_H: tl.constexpr, SPLIT: tl.constexpr, USE_WINDOW: tl.constexpr,
    DOT_PREC: tl.constexpr, GATED: tl.constexpr, ROPE: tl.constexpr, USE_PDL: tl.constexpr,
):
    if USE_PDL:  # the kernel before wrote this one's inputs
        pdl_wait()
    # program (request, kv head, split): the `group` query heads of one kv head, one token
    req = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + req)
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, HEAD_PAD)
    heads = kvh * group + h  # [BLOCK_H]
    qmask = (h < group)[:, None] & (d < head_size)[None, :]
    q_rows = q_ptr + req * stride_qt + heads[:, None] * stride_qh  # [BLOCK_H, 1]
    n_tiles = tl.cdiv(seq_len, TILE_N)
    t_first = 0
    if USE_WINDOW:
        t_first = tl.maximum(seq_len - window, 0) // TILE_N
    per_split = tl.cdiv(n_tiles - t_first, num_splits)
    t_begin = t_first + split * per_split
    t_end = tl.minimum(t_begin + per_split, n_tiles)
    if ROPE:
        pos = tl.load(pos_ptr + req).to(tl.int64)
        first = d < half
        j = tl.where(first, d, d - half)  # [HEAD_PAD] frequency index
        rot = d < 2 * half
        cos = tl.load(cos_sin_ptr + pos * stride_cos + j, mask=rot, other=1.0)
        sin = tl.load(cos_sin_ptr + pos * stride_cos + half + j, mask=rot, other=0.0)
        sin = tl.where(first, -sin, sin)
        partner = tl.where(first, d + half, tl.where(rot, d - half, d))
        q = _rope(q_rows, d[None, :], qmask, cos[None, :], sin[None, :], partner[None, :])
        slot = tl.load(slot_ptr + req).to(tl.int64)
        # the new token (position seq_len - 1) lies in tile n_tiles - 1: its split writes it
        if (slot >= 0) & (t_begin < n_tiles) & (t_end == n_tiles):
            dmask = d < head_size
            k = _rope(kn_ptr + req * stride_knt + kvh * stride_knh, d, dmask, cos, sin, partner)
            v = tl.load(vn_ptr + req * stride_vnt + kvh * stride_vnh + d, mask=dmask, other=0.0)
            dst = ((slot // BLOCK_SIZE) * stride_block + (slot % BLOCK_SIZE) * stride_slot
                   + kvh * stride_head + d)
            tl.store(k_ptr + dst, k.to(k_ptr.dtype.element_ty), mask=dmask)
            tl.store(v_ptr + dst, v.to(v_ptr.dtype.element_ty), mask=dmask)
            tl.debug_barrier()  # the CTA's stores are visible to its tile loads below
    else:
        q = tl.load(q_rows + d[None, :], mask=qmask, other=0.0)  # [BLOCK_H, HEAD_PAD]
    acc = tl.zeros([BLOCK_H, HEAD_PAD], dtype=tl.float32)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc, m_i, l_i = _attend_tiles(
        q, acc, m_i, l_i, k_ptr, v_ptr, bt_ptr + req * stride_bt, kvh * stride_head,
        tl.zeros([BLOCK_H], dtype=tl.int32) + seq_len - 1, seq_len, t_begin, t_end,
        stride_block, stride_slot, qk_scale, head_size, window,
        BLOCK_SIZE, TILE_N, HEAD_PAD, False, USE_WINDOW, DOT_PREC)
    if SPLIT:
        # partials: acc [reqs, nq, splits, HEAD_PAD], (m, l) [reqs, nq, splits, 2]
        ph = (req * num_q_heads + heads) * num_splits + split  # [BLOCK_H]
        tl.store(part_acc_ptr + ph[:, None] * HEAD_PAD + d[None, :], acc,
                 mask=(h < group)[:, None])
        tl.store(part_ml_ptr + ph * 2, m_i, mask=h < group)
        tl.store(part_ml_ptr + ph * 2 + 1, l_i, mask=h < group)
    else:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        _store_out(out_ptr, req * stride_ot + heads[:, None] * stride_oh + d[None, :], gate_ptr,
                   req * stride_gt + heads[:, None] * stride_gh + d[None, :], out, qmask, GATED)


def _new_kv(q: torch.Tensor, kv_cache: torch.Tensor, positions, key, value, cos_sin_cache,
            slot_mapping) -> tuple:
    """Validate this step's (positions, key, value, cos_sin_cache, slot_mapping); -> kernel
    args (the tensors, then key's / value's token and head strides, the table's stride and
    rotary_dim // 2), or stand-ins and zeros without them."""
    given = [t is not None for t in (positions, key, value, cos_sin_cache, slot_mapping)]
    check(all(given) or not any(given),
          "positions, key, value, cos_sin_cache and slot_mapping go together")
    if not any(given):
        return (q, q, q, q, q, 0, 0, 0, 0, 0, 0)
    n, hd, nkv = q.shape[0], q.shape[2], kv_cache.shape[3]
    check(_check_positions(positions) == n, lambda: f"positions must be [{n}]")
    heads = [_heads_view(name, t, n, hd) for name, t in (("key", key), ("value", value))]
    check(heads[0][0] == heads[1][0] == nkv,
          lambda: f"key and value must have {nkv} heads of {hd}, got {heads[0][0]}, "
          f"{heads[1][0]}")
    rot = _check_cos_sin_cache(cos_sin_cache, hd)
    check(slot_mapping.dim() == 1 and slot_mapping.shape[0] == n
          and slot_mapping.dtype in (torch.int32, torch.int64),
          lambda: f"slot_mapping must be a [{n}] int32/int64 tensor")
    check_same_device(q=q, positions=positions, key=key, value=value,
                      cos_sin_cache=cos_sin_cache, slot_mapping=slot_mapping)
    return (key, value, positions, slot_mapping, cos_sin_cache, heads[0][1], heads[0][2],
            heads[1][1], heads[1][2], cos_sin_cache.stride(0), rot // 2)


def paged_attention_decode(
    q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
    seq_lens: torch.Tensor, scale: float, out: torch.Tensor | None = None,
    sliding_window: int | None = None, num_splits: int | None = None, tile_n: int = 64,
    num_warps: int = 4, num_stages: int = 2, output_gate: torch.Tensor | None = None,
    positions: torch.Tensor | None = None, key: torch.Tensor | None = None,
    value: torch.Tensor | None = None, cos_sin_cache: torch.Tensor | None = None,
    slot_mapping: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query token per request. q: [num_reqs, nq, hd] -> out [num_reqs, nq, hd].

    sliding_window: each query sees its last `sliding_window` positions (None: all).
    num_splits: KV splits per (request, kv head) (flash-decoding); default fills the SMs.
    output_gate: [num_reqs, nq, hd] like q (any strides): out * sigmoid(output_gate).
    positions [num_reqs], key / value [num_reqs, nkv * hd] (or [.., nkv, hd] views),
    cos_sin_cache [max_position, rotary_dim] float32 (cos then sin halves), slot_mapping
    [num_reqs]: this step's token, not yet in the cache and q not yet rotated; the launch
    rotates q and key by positions and writes key and value at slot_mapping first. The
    slot must be position seq_len - 1 of its request's blocks, as the engine's slot mapping.
    """
    _check_window(sliding_window)
    n, nq, hd = q.shape
    block_size, nkv, group = _check_cache(q, kv_cache, block_table, seq_lens, n)
    new_kv = _new_kv(q, kv_cache, positions, key, value, cos_sin_cache, slot_mapping)
    out = _out(q, out)
    gate, sgt, sgh = _gate(q, output_gate, out)
    if n == 0:
        return out
    if num_splits is None:  # flash-decoding only while (request, kv head) pairs leave SMs idle
        num_splits = _kv_splits(n * nkv, q.device, 64, 4)
    check(1 <= num_splits <= 256, lambda: f"num_splits must be in [1, 256], got {num_splits}")
    head_pad = max(16, next_pow2(hd))
    tile_n = _tile_n(tile_n, head_pad)
    split = num_splits > 1
    part_acc = torch.empty(n, nq, num_splits, head_pad, dtype=torch.float32, device=q.device)
    part_ml = torch.empty(n, nq, num_splits, 2, dtype=torch.float32, device=q.device)
    prec = "ieee" if q.dtype == torch.float32 else "tf32"
    _paged_attention_decode_kernel[(n, nkv, num_splits)](
        q, kv_cache[0], kv_cache[1], block_table, seq_lens, out, part_acc, part_ml, gate,
        *new_kv[:5], q.stride(0), q.stride(1), block_table.stride(0), kv_cache.stride(1),
        kv_cache.stride(2), kv_cache.stride(3), out.stride(0), out.stride(1), sgt, sgh,
        *new_kv[5:10], nq, hd, group, scale * LOG2E, num_splits, sliding_window or 0,
        new_kv[10], BLOCK_SIZE=block_size, TILE_N=tile_n, HEAD_PAD=head_pad,
        BLOCK_H=max(16, next_pow2(group)), SPLIT=split, USE_WINDOW=sliding_window is not None,
        DOT_PREC=prec, GATED=output_gate is not None, ROPE=key is not None,
        num_warps=num_warps, num_stages=num_stages, **pdl_launch(q),
    )
    if split:
        _paged_attention_decode_reduce_kernel[(n, nq)](
            part_acc, part_ml, out, None, gate, out.stride(0), out.stride(1), sgt, sgh, nq, hd,
            num_splits, HEAD_PAD=head_pad, SPLITS_PAD=_splits_pad(num_splits),
            GATED=output_gate is not None, num_warps=4, **pdl_launch(q),
        )
    return out


def paged_attention_decode_ref(
    q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
    seq_lens: torch.Tensor, scale: float, sliding_window: int | None = None,
) -> torch.Tensor:
    """Decode is prefill with one query token per request."""
    qsl = torch.arange(q.shape[0] + 1, dtype=torch.int32)
    return paged_attention_prefill_ref(q, kv_cache, qsl, seq_lens, block_table, scale,
                                       sliding_window)
