"""Paged decode attention in Triton: one query token per request, split-KV (flash-decoding).

Mirrors vllm/v1/attention/ops/triton_decode_attention.py (grouped split-KV decode: a
program per (request, kv head, split) holds the kv head's `group` query heads in the rows
of one tile; stage 2 merges the splits, here kernels/paged_attention.py's reduce kernel).
The split count is fixed by the launch (a CUDA graph keeps it), the context is not: each
row uses only the splits that hold its tiles (cdiv(tiles, cdiv(tiles, splits))), the rest
return at once; a row one split holds is written by the decode kernel itself and the
reduce's programs return at once for it (both count the splits from seq_lens before their
PDL wait), so batch-1 decode at short context writes and merges no partial states.
A one-row launch (batch-1 decode, ONE_ROW) also loads its first tile's keys and values
before the wait, all but the newest: the older ones were written in earlier steps, and with
one row no other request writes the cache this step; the newest key, written by the kernel
just before, and q are loaded after the wait. Its latency is then one L2 round trip after
the wait instead of three (seq_len, block table, then the keys).
Layout and metadata as kernels/paged_attention.py (the engine's, engine/layers/attention.py);
an fp8 cache is dequantized as there (_dequant, after the PDL wait for ONE_ROW's early tile).
The step's RoPE and KV-cache write run in an earlier launch (kernels/rotary_cache.py or
kernels/gemv_rope_cache.py): a request admitted this step with a prefix-cache hit may read
the block another request's new token fills, so that write must finish before any program
attends.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from libvllm.kernels._common import check, next_pow2, pdl_launch, pdl_wait
from libvllm.kernels.launch_cache import cached_launch
from libvllm.kernels.paged_attention import (
    LOG2E,
    _attend_tile,
    _attend_tiles,
    _check_cache,
    _check_window,
    _dequant,
    _gate,
    _kv_splits,
    _out,
    _paged_attention_decode_reduce_kernel,
    _splits_pad,
    _splits_used,
    _store_out,
    _tile_n,
    _tile_rows,
    paged_attention_prefill_ref,
)


@cached_launch
@triton.jit(do_not_specialize=["num_splits"])  # one compile for every split count
def _paged_attention_decode_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, seq_lens_ptr, out_ptr, part_acc_ptr, part_ml_ptr, gate_ptr,
    k_scale_ptr, v_scale_ptr, stride_qt: tl.int64, stride_qh, stride_bt: tl.int64,
    stride_block: tl.int64,
    stride_slot: tl.int64, stride_head, stride_ot: tl.int64, stride_oh, stride_gt: tl.int64,
    stride_gh, num_q_heads, head_size, group, qk_scale, num_splits, window,
    BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr, HEAD_PAD: tl.constexpr,
    BLOCK_H: tl.constexpr, SPLIT: tl.constexpr, USE_WINDOW: tl.constexpr,
    DOT_PREC: tl.constexpr, GATED: tl.constexpr, ONE_ROW: tl.constexpr,
    FP8: tl.constexpr, USE_PDL: tl.constexpr,
):
    # program (request, kv head, split): the `group` query heads of one kv head, one token.
    # Before the wait: seq_lens, the block table (copied in before the step) and, with
    # ONE_ROW, the first tile's keys older than the newest (written in earlier steps; no
    # other row writes the cache this step); the newest key and q come after it.
    req = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + req)
    t_first, per_split, used = _splits_used(seq_len, num_splits, window, TILE_N, USE_WINDOW)
    t_begin = t_first + split * per_split
    t_end = tl.minimum(t_begin + per_split, tl.cdiv(seq_len, TILE_N))
    bt_row = bt_ptr + req * stride_bt
    d = tl.arange(0, HEAD_PAD)
    dmask = d[None, :] < head_size
    if ONE_ROW:  # tile t_begin's keys but the newest, [TILE_N, HEAD_PAD] each
        kpos, kmask, row = _tile_rows(bt_row, kvh * stride_head, t_begin, seq_len,
                                      stride_block, stride_slot, BLOCK_SIZE, TILE_N)
        kp = k_ptr + row[:, None] + d[None, :]
        vp = v_ptr + row[:, None] + d[None, :]
        old = (kmask & (kpos < seq_len - 1))[:, None] & dmask
        k = tl.load(kp, mask=old, other=0.0)
        v = tl.load(vp, mask=old, other=0.0)
    if USE_PDL:  # the kernel before wrote q and the newest key
        pdl_wait()
    if SPLIT and split >= used:
        return
    h = tl.arange(0, BLOCK_H)
    heads = kvh * group + h  # [BLOCK_H]
    qmask = (h < group)[:, None] & dmask
    q = tl.load(q_ptr + req * stride_qt + heads[:, None] * stride_qh + d[None, :], mask=qmask,
                other=0.0)  # [BLOCK_H, HEAD_PAD]
    qpos = tl.zeros([BLOCK_H], dtype=tl.int32) + seq_len - 1
    acc = tl.zeros([BLOCK_H, HEAD_PAD], dtype=tl.float32)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    if ONE_ROW:  # the newest key joins tile t_begin's when it holds it
        new = (kmask & (kpos == seq_len - 1))[:, None] & dmask
        k = tl.where(new, tl.load(kp, mask=new, other=0.0), k)
        v = tl.where(new, tl.load(vp, mask=new, other=0.0), v)
        k = _dequant(k, k_scale_ptr, q.dtype, FP8)
        v = _dequant(v, v_scale_ptr, q.dtype, FP8)
        acc, m_i, l_i = _attend_tile(q, acc, m_i, l_i, k, v, kpos, kmask, qpos, qk_scale,
                                     window, False, USE_WINDOW, DOT_PREC)
        t_begin += 1
    acc, m_i, l_i = _attend_tiles(
        q, acc, m_i, l_i, k_ptr, v_ptr, bt_row, kvh * stride_head, qpos, seq_len, t_begin,
        t_end, stride_block, stride_slot, qk_scale, head_size, window, k_scale_ptr, v_scale_ptr,
        BLOCK_SIZE, TILE_N, HEAD_PAD, False, USE_WINDOW, DOT_PREC, FP8)
    if SPLIT and used > 1:
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


def paged_attention_decode(
    q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
    seq_lens: torch.Tensor, scale: float, out: torch.Tensor | None = None,
    sliding_window: int | None = None, num_splits: int | None = None, tile_n: int = 64,
    num_warps: int = 4, num_stages: int = 2, output_gate: torch.Tensor | None = None,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query token per request. q: [num_reqs, nq, hd] -> out [num_reqs, nq, hd].

    sliding_window: each query sees its last `sliding_window` positions (None: all).
    num_splits: KV splits per (request, kv head) (flash-decoding); default fills the SMs.
    output_gate: [num_reqs, nq, hd] like q (any strides): out * sigmoid(output_gate).
    k_scale, v_scale: [1] float32, the dequantization scales of an fp8 kv_cache.
    One row (num_reqs 1) reads its keys older than position seq_len - 1 before the PDL
    wait: the launch just before may write only the row's newest key and value (and q).
    """
    _check_window(sliding_window)
    n, nq, hd = q.shape
    block_size, nkv, group, fp8 = _check_cache(q, kv_cache, block_table, seq_lens, n, k_scale,
                                               v_scale)
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
    part_acc = part_ml = out  # unused by one split: no allocation on the eager path
    if split:  # per call, so graph capture takes them from the graph pool
        part_acc = torch.empty(n, nq, num_splits, head_pad, dtype=torch.float32,
                               device=q.device)
        part_ml = torch.empty(n, nq, num_splits, 2, dtype=torch.float32, device=q.device)
    prec = "ieee" if q.dtype == torch.float32 else "tf32"
    _paged_attention_decode_kernel[(n, nkv, num_splits)](
        q, kv_cache[0], kv_cache[1], block_table, seq_lens, out, part_acc, part_ml, gate,
        k_scale if fp8 else None, v_scale if fp8 else None, q.stride(0), q.stride(1),
        block_table.stride(0), kv_cache.stride(1), kv_cache.stride(2),
        kv_cache.stride(3), out.stride(0), out.stride(1), sgt, sgh, nq, hd, group,
        scale * LOG2E, num_splits, sliding_window or 0, BLOCK_SIZE=block_size, TILE_N=tile_n,
        HEAD_PAD=head_pad, BLOCK_H=max(16, next_pow2(group)), SPLIT=split,
        USE_WINDOW=sliding_window is not None, DOT_PREC=prec, GATED=output_gate is not None,
        ONE_ROW=n == 1, FP8=fp8, num_warps=num_warps, num_stages=num_stages, **pdl_launch(q),
    )
    if split:
        _paged_attention_decode_reduce_kernel[(n, nq)](
            part_acc, part_ml, out, None, gate, out.stride(0), out.stride(1), sgt, sgh, nq, hd,
            num_splits, HEAD_PAD=head_pad, SPLITS_PAD=_splits_pad(num_splits),
            GATED=output_gate is not None, num_warps=4, seq_lens_ptr=seq_lens,
            window=sliding_window or 0, TILE_N=tile_n, USE_WINDOW=sliding_window is not None,
            **pdl_launch(q),
        )
    return out


def paged_attention_decode_ref(
    q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
    seq_lens: torch.Tensor, scale: float, sliding_window: int | None = None,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode is prefill with one query token per request."""
    qsl = torch.arange(q.shape[0] + 1, dtype=torch.int32)
    return paged_attention_prefill_ref(q, kv_cache, qsl, seq_lens, block_table, scale,
                                       sliding_window, k_scale, v_scale)
