"""Paged attention over the engine's KV cache in Triton: prefill/extend (the unified varlen
kernel), the split-KV reduce and the helpers kernels/decode_attention.py shares.

Mirrors vllm/v1/attention/ops/triton_decode_attention.py's stage 2 reduction and
triton_unified_attention.py (varlen queries found by a binary search
over query_start_loc in q-block units, GQA query heads packed into the rows of one tile,
causal over a cached prefix, and its 3D variant: kernel_unified_attention_3d splits each
program's KV tiles into segments when the 2D grid leaves SMs idle, reduce_segments merges
them). Like FlashAttention's causal loop, a program runs the KV tiles before its q block's
diagonal without masks and masks only the rest. Own code; the layout and metadata are the engine's
(engine/layers/attention.py): kv_cache [2, num_blocks, block_size, num_kv_heads, head_size],
block_table [num_reqs, max_blocks] int32, seq_lens [num_reqs] (context incl. this step's
tokens), query_start_loc [num_reqs + 1]; query token j of request i sits at position
seq_len - q_len + j and sees keys <= it. All metadata stays on the device: no host sync.

An fp8 cache (float8_e4m3fn, written by kernels/reshape_and_cache.py's quantize_kv) is
read as vLLM's triton_unified_attention _cast_kv_tile (FP8 per-tensor): each loaded tile
times the layer's k_scale / v_scale (one-element float32 device tensors) in fp32, rounded
to q's dtype before the dots.

Precondition: block_table entries of the first cdiv(seq_len, block_size) columns are valid
block ids (the KV cache manager owns them). A request with seq_len 0 yields zeros; prefill
leaves the rows past query_start_loc[num_reqs] untouched.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from libvllm.kernels._common import (
    cdiv,
    check,
    check_float,
    check_same_device,
    next_pow2,
    pdl_launch,
    pdl_wait,
)
from libvllm.kernels._common import num_sms as _num_sms
from libvllm.kernels.launch_cache import cached_launch
from libvllm.kernels.reshape_and_cache import check_kv_cache_dtype, dequantize_kv_ref

LOG2E = 1.4426950408889634


@triton.jit
def _tile_rows(bt_ptr, kv_off, t, seq_len, stride_block, stride_slot,
               BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr, MASKED: tl.constexpr = True):
    """KV tile t of a request: key positions kpos [TILE_N], kmask (kpos < seq_len) and
    the keys' cache row offsets [TILE_N] int64 (bt_ptr: the request's block-table row).
    MASKED False: the caller knows the whole tile lies before seq_len (no load mask)."""
    kpos = t * TILE_N + tl.arange(0, TILE_N)
    kmask = kpos < seq_len
    if MASKED:
        blk = tl.load(bt_ptr + kpos // BLOCK_SIZE, mask=kmask, other=0).to(tl.int64)
    else:
        blk = tl.load(bt_ptr + kpos // BLOCK_SIZE).to(tl.int64)
    return kpos, kmask, blk * stride_block + (kpos % BLOCK_SIZE) * stride_slot + kv_off


@triton.jit
def _dequant(x, scale_ptr, dtype, FP8: tl.constexpr):
    """A loaded KV tile as attention reads it: with FP8, x * scale in fp32 rounded to
    dtype (q's); else x."""
    y = x
    if FP8:  # a constexpr branch: y may change type (one return, one type)
        y = (x.to(tl.float32) * tl.load(scale_ptr)).to(dtype)
    return y


@triton.jit
def _attend_tile(q, acc, m_i, l_i, k, v, kpos, kmask, qpos, qk_scale, window,
                 CAUSAL: tl.constexpr, USE_WINDOW: tl.constexpr, DOT_PREC: tl.constexpr,
                 MASKED: tl.constexpr = True):
    """One online-softmax step of q [BLOCK_M, HEAD_PAD] over a loaded tile k, v
    [TILE_N, HEAD_PAD] at positions kpos (kmask: the valid keys) -> (acc, m_i, l_i).
    MASKED False: every row sees every key of the tile (no mask, every score finite)."""
    s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=DOT_PREC) * qk_scale
    if MASKED:
        mask = kmask[None, :]
        if CAUSAL:
            mask = mask & (kpos[None, :] <= qpos[:, None])
        if USE_WINDOW:
            mask = mask & (kpos[None, :] > qpos[:, None] - window)
        s = tl.where(mask, s, float("-inf"))  # [BLOCK_M, TILE_N]
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = m_new
    if MASKED:
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no key yet
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype), input_precision=DOT_PREC)
    return acc, m_new, l_i


@triton.jit
def _attend_tiles(
    q, acc, m_i, l_i, k_ptr, v_ptr, bt_ptr, kv_off, qpos, seq_len, t_begin, t_end,
    stride_block, stride_slot, qk_scale, head_size, window, k_scale_ptr, v_scale_ptr,
    BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr, HEAD_PAD: tl.constexpr,
    CAUSAL: tl.constexpr, USE_WINDOW: tl.constexpr, DOT_PREC: tl.constexpr,
    FP8: tl.constexpr, MASKED: tl.constexpr = True,
):
    """Online softmax of q [BLOCK_M, HEAD_PAD] over KV tiles [t_begin, t_end) of TILE_N keys.

    acc [BLOCK_M, HEAD_PAD], m_i / l_i [BLOCK_M] (base-2 running max / sum), all fp32.
    qpos [BLOCK_M]: each row's position; with USE_WINDOW a row sees keys > qpos - window.
    MASKED False: the caller knows every row sees every key of these tiles (the tiles
    before the diagonal of a causal block): no key, causal or window mask.
    FP8: the cache is fp8, dequantized with k_scale_ptr / v_scale_ptr (_dequant).
    """
    d = tl.arange(0, HEAD_PAD)
    for t in range(t_begin, t_end):
        kpos, kmask, row = _tile_rows(bt_ptr, kv_off, t, seq_len, stride_block, stride_slot,
                                      BLOCK_SIZE, TILE_N, MASKED)
        ld_mask = d[None, :] < head_size
        if MASKED:
            ld_mask = kmask[:, None] & ld_mask
        k = tl.load(k_ptr + row[:, None] + d[None, :], mask=ld_mask, other=0.0)  # [TILE_N, HP]
        v = tl.load(v_ptr + row[:, None] + d[None, :], mask=ld_mask, other=0.0)
        k = _dequant(k, k_scale_ptr, q.dtype, FP8)
        v = _dequant(v, v_scale_ptr, q.dtype, FP8)
        acc, m_i, l_i = _attend_tile(q, acc, m_i, l_i, k, v, kpos, kmask, qpos, qk_scale,
                                     window, CAUSAL, USE_WINDOW, DOT_PREC, MASKED)
    return acc, m_i, l_i


@triton.jit
def _splits_used(seq_len, num_splits, window, TILE_N: tl.constexpr, USE_WINDOW: tl.constexpr):
    """A decode row's split-KV plan -> (t_first, per_split, used): its first tile (the
    sliding window's), tiles a split, and the splits that hold tiles (1 for an empty row;
    the rest do nothing, and a row one split holds is written by the decode kernel itself:
    short contexts in a graph captured for many splits)."""
    n_tiles = tl.cdiv(seq_len, TILE_N)
    t_first = 0
    if USE_WINDOW:
        t_first = tl.maximum(seq_len - window, 0) // TILE_N
    per_split = tl.cdiv(n_tiles - t_first, num_splits)
    used = tl.maximum(tl.cdiv(n_tiles - t_first, tl.maximum(per_split, 1)), 1)
    return t_first, per_split, used


@triton.jit
def _store_out(out_ptr, out_off, gate_ptr, gate_off, out, mask, GATED: tl.constexpr):
    """Store out (fp32) rounded to out's dtype; GATED: times sigmoid(gate), rounded as
    torch's `out * torch.sigmoid(gate)` in that dtype (Qwen3-Next's attention output gate)."""
    o = out.to(out_ptr.dtype.element_ty)
    if GATED:
        g = tl.load(gate_ptr + gate_off, mask=mask, other=0.0).to(tl.float32)
        sig = tl.sigmoid(g).to(out_ptr.dtype.element_ty).to(tl.float32)
        o = (o.to(tl.float32) * sig).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + out_off, o, mask=mask)


# rows_end_ptr is query_start_loc[num_reqs:], whose alignment changes with every step's
# request count: a scalar load, not worth a variant each
@cached_launch
@triton.jit(do_not_specialize=["num_splits"],
            do_not_specialize_on_alignment=["rows_end_ptr", "seq_lens_ptr"])
def _paged_attention_decode_reduce_kernel(
    part_acc_ptr, part_ml_ptr, out_ptr, rows_end_ptr, gate_ptr, stride_ot: tl.int64, stride_oh,
    stride_gt: tl.int64, stride_gh, num_q_heads, head_size, num_splits, HEAD_PAD: tl.constexpr,
    SPLITS_PAD: tl.constexpr, GATED: tl.constexpr, USE_PDL: tl.constexpr,
    seq_lens_ptr=None, window=0, TILE_N: tl.constexpr = 64, USE_WINDOW: tl.constexpr = False,
):
    # program (row, query head): merge the splits' partial softmax states; a row is a
    # request (decode) or a query token (prefill segments)
    req = tl.program_id(0).to(tl.int64)
    used = num_splits
    if seq_lens_ptr is not None:  # decode: the splits that held tiles (one wrote out itself),
        # from seq_lens before the wait (copied in before the step: pdl_wait's rule)
        used = _splits_used(tl.load(seq_lens_ptr + req), num_splits, window, TILE_N,
                            USE_WINDOW)[2]
    if USE_PDL:  # the decode or prefill kernel wrote the partials
        pdl_wait()
    if rows_end_ptr is not None:  # prefill: tokens past query_start_loc[-1] stay untouched
        if req >= tl.load(rows_end_ptr):
            return
    if used == 1:
        return
    head = tl.program_id(1)
    sp = tl.arange(0, SPLITS_PAD)
    d = tl.arange(0, HEAD_PAD)
    base = (req * num_q_heads + head) * num_splits + sp  # [SPLITS_PAD]
    smask = sp < used
    m = tl.load(part_ml_ptr + base * 2, mask=smask, other=float("-inf"))
    ll = tl.load(part_ml_ptr + base * 2 + 1, mask=smask, other=0.0)
    acc = tl.load(part_acc_ptr + base[:, None] * HEAD_PAD + d[None, :], mask=smask[:, None],
                  other=0.0)  # [SPLITS_PAD, HEAD_PAD]
    m_max = tl.max(m, 0)
    w = tl.exp2(m - tl.where(m_max == float("-inf"), 0.0, m_max))  # [SPLITS_PAD]
    denom = tl.sum(ll * w, 0)
    out = tl.sum(acc * w[:, None], 0) / tl.where(denom == 0.0, 1.0, denom)
    _store_out(out_ptr, req * stride_ot + head * stride_oh + d, gate_ptr,
               req * stride_gt + head * stride_gh + d, out, d < head_size, GATED)


@triton.jit
def _find_request(qsl_ptr, q_block, num_reqs, BLOCK_Q: tl.constexpr):
    """Largest i with query_start_loc[i] // BLOCK_Q + i <= q_block (vLLM's find_seq_idx)."""
    lo: tl.int32 = 0
    hi = num_reqs
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(qsl_ptr + mid) // BLOCK_Q + mid <= q_block:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


# num_reqs changes every step: specializing it (== 1, % 16) would JIT a variant mid-serving;
# so would the alignment of the metadata pointers, which an eager mixed step's prefill rows
# pass as slices past its decode rows (engine/layers/attention.py): scalar loads either way
@cached_launch
@triton.jit(do_not_specialize=["num_reqs", "num_segments"],
            do_not_specialize_on_alignment=["bt_ptr", "seq_lens_ptr", "qsl_ptr"])
def _paged_attention_prefill_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, seq_lens_ptr, qsl_ptr, out_ptr, part_acc_ptr, part_ml_ptr,
    gate_ptr, k_scale_ptr, v_scale_ptr, num_reqs, stride_qt: tl.int64, stride_qh,
    stride_bt: tl.int64,
    stride_block: tl.int64, stride_slot: tl.int64, stride_head, stride_ot: tl.int64, stride_oh,
    stride_gt: tl.int64, stride_gh, num_q_heads, head_size, group, qk_scale, window,
    num_segments, BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr, HEAD_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, SPLIT: tl.constexpr,
    USE_WINDOW: tl.constexpr, DOT_PREC: tl.constexpr, GATED: tl.constexpr,
    FP8: tl.constexpr, USE_PDL: tl.constexpr,
):
    if USE_PDL:  # the kernel before wrote this one's inputs
        pdl_wait()
    # program (q block, kv head[, segment]): BLOCK_Q query tokens x `group` heads = the rows
    # of one tile, over all its KV tiles or (SPLIT) one segment of them
    q_block = tl.program_id(0)
    kvh = tl.program_id(1)
    req = _find_request(qsl_ptr, q_block, num_reqs, BLOCK_Q)
    q_start = tl.load(qsl_ptr + req)
    q_len = tl.load(qsl_ptr + req + 1) - q_start
    local = q_block - (q_start // BLOCK_Q + req)
    if local * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + req)
    ctx = seq_len - q_len  # cached prefix length
    r = tl.arange(0, BLOCK_M)
    d = tl.arange(0, HEAD_PAD)
    tok = local * BLOCK_Q + r // group  # [BLOCK_M] index within the request's query
    heads = kvh * group + r % group
    rmask = (r < BLOCK_Q * group) & (tok < q_len)
    qmask = rmask[:, None] & (d < head_size)[None, :]
    row = (q_start + tok).to(tl.int64)
    q = tl.load(q_ptr + row[:, None] * stride_qt + heads[:, None] * stride_qh + d[None, :],
                mask=qmask, other=0.0)  # [BLOCK_M, HEAD_PAD]
    kv_end = tl.minimum(seq_len, ctx + (local + 1) * BLOCK_Q)  # keys the last row can see
    t_begin = 0
    if USE_WINDOW:  # keys the first row can see start at its position - window + 1
        t_begin = tl.maximum(ctx + local * BLOCK_Q - window + 1, 0) // TILE_N
    t_end = tl.cdiv(kv_end, TILE_N)
    if SPLIT:  # this segment's share of the tiles [t_begin, t_end); it may be empty
        seg = tl.program_id(2)
        per_seg = tl.cdiv(tl.maximum(t_end - t_begin, 0), num_segments)
        t_begin = t_begin + seg * per_seg
        t_end = tl.minimum(t_begin + per_seg, t_end)
    # tiles before t_full hold only keys at or before the block's first row: no mask
    # (a sliding window masks from the other end: every tile goes masked)
    t_full = t_begin
    if not USE_WINDOW:
        t_full = tl.minimum(tl.maximum((ctx + local * BLOCK_Q + 1) // TILE_N, t_begin), t_end)
    acc = tl.zeros([BLOCK_M, HEAD_PAD], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    bt_row = bt_ptr + req.to(tl.int64) * stride_bt
    acc, m_i, l_i = _attend_tiles(
        q, acc, m_i, l_i, k_ptr, v_ptr, bt_row, kvh * stride_head, ctx + tok, seq_len,
        t_begin, t_full, stride_block, stride_slot, qk_scale, head_size, window, k_scale_ptr,
        v_scale_ptr, BLOCK_SIZE, TILE_N, HEAD_PAD, True, USE_WINDOW, DOT_PREC, FP8, False)
    acc, m_i, l_i = _attend_tiles(
        q, acc, m_i, l_i, k_ptr, v_ptr, bt_row, kvh * stride_head, ctx + tok, seq_len,
        t_full, t_end, stride_block, stride_slot, qk_scale, head_size, window, k_scale_ptr,
        v_scale_ptr, BLOCK_SIZE, TILE_N, HEAD_PAD, True, USE_WINDOW, DOT_PREC, FP8)
    if SPLIT:  # partials (empty: m -inf, l 0): acc [T, nq, segs, HEAD_PAD], (m, l) [.., 2]
        ph = (row * num_q_heads + heads) * num_segments + seg  # [BLOCK_M]
        tl.store(part_acc_ptr + ph[:, None] * HEAD_PAD + d[None, :], acc, mask=rmask[:, None])
        tl.store(part_ml_ptr + ph * 2, m_i, mask=rmask)
        tl.store(part_ml_ptr + ph * 2 + 1, l_i, mask=rmask)
    else:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        _store_out(out_ptr, row[:, None] * stride_ot + heads[:, None] * stride_oh + d[None, :],
                   gate_ptr, row[:, None] * stride_gt + heads[:, None] * stride_gh + d[None, :],
                   out, qmask, GATED)


def _check_cache(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                 seq_lens: torch.Tensor, num_reqs: int, k_scale: torch.Tensor | None,
                 v_scale: torch.Tensor | None) -> tuple[int, int, int, bool]:
    """Validate the shared arguments; -> (block_size, num_kv_heads, group, fp8 cache)."""
    check_float("q", q)
    check(q.dim() == 3 and q.stride(2) == 1,
          lambda: f"q must be [num_tokens, num_heads, head_size] "
          f"with a contiguous last dimension, got {tuple(q.shape)}")
    check(kv_cache.dim() == 5 and kv_cache.shape[0] == 2 and kv_cache.shape[4] == q.shape[2]
          and kv_cache.stride(4) == 1, lambda: "kv_cache must be [2, num_blocks, block_size, "
          f"num_kv_heads, {q.shape[2]}] with a contiguous last dimension, got "
          f"{tuple(kv_cache.shape)}")
    fp8 = check_kv_cache_dtype(kv_cache, k_scale, v_scale)
    nkv = kv_cache.shape[3]
    check(q.shape[1] % nkv == 0,
          lambda: f"num_heads {q.shape[1]} must be a multiple of num_kv_heads "
          f"{nkv}")
    check(block_table.dim() == 2 and block_table.shape[0] >= num_reqs
          and block_table.dtype == torch.int32 and block_table.stride(1) == 1,
          lambda: f"block_table must be [>= {num_reqs}, max_blocks] int32, got "
          f"{tuple(block_table.shape)} {block_table.dtype}")
    check(seq_lens.dim() == 1 and seq_lens.shape[0] == num_reqs and seq_lens.dtype == torch.int32,
          lambda: f"seq_lens must be [{num_reqs}] int32, got {tuple(seq_lens.shape)} "
          f"{seq_lens.dtype}")
    check_same_device(q=q, kv_cache=kv_cache, block_table=block_table, seq_lens=seq_lens)
    return kv_cache.shape[2], nkv, q.shape[1] // nkv, fp8


def _out(q: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    if out is None:
        return torch.empty_like(q, memory_format=torch.contiguous_format)
    check(out.shape == q.shape and out.dtype == q.dtype and out.stride(2) == 1,
          lambda: f"out must match q: {tuple(q.shape)} {q.dtype}")
    return out


def _gate(q: torch.Tensor, output_gate: torch.Tensor | None, out: torch.Tensor
          ) -> tuple[torch.Tensor, int, int]:
    """(gate tensor or a stand-in, token stride, head stride) of output_gate [T, nq, hd]."""
    if output_gate is None:
        return out, 0, 0
    check(output_gate.shape == q.shape and output_gate.dtype == q.dtype
          and output_gate.stride(2) == 1, lambda: f"output_gate must be {tuple(q.shape)} "
          f"{q.dtype} with a contiguous last dimension, got {tuple(output_gate.shape)} "
          f"{output_gate.dtype}")
    check_same_device(q=q, output_gate=output_gate)
    return output_gate, output_gate.stride(0), output_gate.stride(1)


def _check_window(sliding_window: int | None) -> None:
    check(sliding_window is None or (isinstance(sliding_window, int) and sliding_window > 0),
          lambda: f"sliding_window must be a positive int or None, got {sliding_window!r}")


def _tile_n(tile_n: int, head_pad: int) -> int:
    """KV tile rows: a power of two >= 16 (tl.dot's K), at most 32 for heads over 128 lanes."""
    check(tile_n >= 16 and tile_n & (tile_n - 1) == 0,
          lambda: f"tile_n must be a power of 2 >= 16, "
          f"got {tile_n}")
    return min(tile_n, 32) if head_pad > 128 else tile_n


def _kv_splits(programs: int, device: torch.device, most: int, per_sm: int) -> int:
    """KV splits per program while `programs` leave SMs idle: about per_sm programs per SM,
    at most `most`. Host ints only (shapes, SM count), so a CUDA graph replays the launch."""
    sms = _num_sms(device)
    return 1 if programs >= sms else min(most, cdiv(per_sm * sms, programs))


def _splits_pad(splits: int) -> int:
    """The reduce kernel's split lanes: 16 or 64 (more only for an explicit larger count), so
    the split counts of every batch size share two compiled variants, not one per power of
    two (each Triton compile costs a second or two of start-up during graph capture)."""
    return 16 if splits <= 16 else max(64, next_pow2(splits))


def paged_attention_prefill(
    q: torch.Tensor, kv_cache: torch.Tensor, query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor, block_table: torch.Tensor, scale: float,
    out: torch.Tensor | None = None, sliding_window: int | None = None, block_m: int = 64,
    tile_n: int = 64, num_warps: int | None = None, num_stages: int = 2,
    num_segments: int | None = None, output_gate: torch.Tensor | None = None,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Varlen causal attention over cached prefixes. q: [num_tokens, nq, hd] -> same shape.

    Any query lengths (1 included), so a mixed prefill + decode batch can use it whole.
    num_segments: KV segments per (q block, kv head) program, merged by a reduce (vLLM's 3D
    kernel); default: up to 16 while the 2D grid leaves SMs idle (batch-1 decode), else 1.
    output_gate: [num_tokens, nq, hd] like q (any strides): out * sigmoid(output_gate).
    k_scale, v_scale: [1] float32, the dequantization scales of an fp8 kv_cache.
    """
    _check_window(sliding_window)
    check(num_segments is None or (isinstance(num_segments, int) and 1 <= num_segments <= 256),
          lambda: f"num_segments must be an int in [1, 256] or None, got {num_segments!r}")
    num_reqs = seq_lens.shape[0] if seq_lens.dim() == 1 else -1
    check(query_start_loc.dim() == 1 and query_start_loc.shape[0] == num_reqs + 1
          and query_start_loc.dtype == torch.int32,
          lambda: "query_start_loc must be [num_reqs + 1] int32, got "
          f"{tuple(query_start_loc.shape)} "
          f"{query_start_loc.dtype}")
    n, nq, hd = q.shape
    block_size, nkv, group, fp8 = _check_cache(q, kv_cache, block_table, seq_lens, num_reqs,
                                               k_scale, v_scale)
    check_same_device(q=q, query_start_loc=query_start_loc)
    out = _out(q, out)
    gate, sgt, sgh = _gate(q, output_gate, out)
    if n == 0 or num_reqs == 0:
        return out
    block_m = max(block_m, 16, next_pow2(group))
    block_q = block_m // group
    head_pad = max(16, next_pow2(hd))
    tile_n = _tile_n(tile_n, head_pad)
    q_blocks = n // block_q + num_reqs  # an upper bound on the q blocks of any split of n
    segs = num_segments or _kv_splits(q_blocks * nkv, q.device, 16, 2)
    split = segs > 1
    part_acc = part_ml = out  # unused by one segment: no allocation on the eager path
    if split:  # per call, so graph capture takes them from the graph pool
        part_acc = torch.empty(n, nq, segs, head_pad, dtype=torch.float32, device=q.device)
        part_ml = torch.empty(n, nq, segs, 2, dtype=torch.float32, device=q.device)
    _paged_attention_prefill_kernel[(q_blocks, nkv, segs)](
        q, kv_cache[0], kv_cache[1], block_table, seq_lens, query_start_loc, out, part_acc,
        part_ml, gate, k_scale if fp8 else None, v_scale if fp8 else None, num_reqs,
        q.stride(0), q.stride(1), block_table.stride(0),
        kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3), out.stride(0),
        out.stride(1), sgt, sgh, nq, hd, group, scale * LOG2E, sliding_window or 0, segs,
        BLOCK_SIZE=block_size, TILE_N=tile_n, HEAD_PAD=head_pad, BLOCK_M=block_m,
        BLOCK_Q=block_q, SPLIT=split, USE_WINDOW=sliding_window is not None,
        DOT_PREC="ieee" if q.dtype == torch.float32 else "tf32", GATED=output_gate is not None,
        FP8=fp8, num_warps=num_warps or (4 if head_pad <= 128 else 8), num_stages=num_stages,
        **pdl_launch(q),
    )
    if split:
        _paged_attention_decode_reduce_kernel[(n, nq)](
            part_acc, part_ml, out, query_start_loc[num_reqs:], gate, out.stride(0),
            out.stride(1), sgt, sgh, nq, hd, segs, HEAD_PAD=head_pad,
            SPLITS_PAD=_splits_pad(segs), GATED=output_gate is not None, num_warps=4,
            **pdl_launch(q),
        )
    return out


def paged_attention_prefill_ref(
    q: torch.Tensor, kv_cache: torch.Tensor, query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor, block_table: torch.Tensor, scale: float,
    sliding_window: int | None = None, k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Plain torch on the same metadata: one SDPA per request over its gathered blocks (the
    engine's CPU path, engine/layers/attention.py paged_attention_ref, computes the same;
    tests/test_kernels_paged_attention.py checks the two agree bit for bit); an fp8 cache
    dequantized with k_scale / v_scale (dequantize_kv_ref)."""
    # q: [num_tokens, nq, hd] -> same shape; a request with seq_len 0 gets zeros
    qsl, lens = query_start_loc.tolist(), seq_lens.tolist()
    block_size = kv_cache.shape[2]
    out = torch.zeros_like(q)
    for i, seq_len in enumerate(lens):
        start, end = qsl[i], qsl[i + 1]
        if seq_len <= 0 or end <= start:
            continue
        blocks = block_table[i, :cdiv(seq_len, block_size)].long()
        kc = kv_cache[0, blocks].flatten(0, 1)[:seq_len]  # [seq_len, nkv, hd]
        vc = kv_cache[1, blocks].flatten(0, 1)[:seq_len]
        qpos = torch.arange(seq_len - (end - start), seq_len, device=q.device)
        kpos = torch.arange(seq_len, device=q.device)[None, :]
        mask = kpos <= qpos[:, None]  # [q_len, seq_len]
        if sliding_window is not None:
            mask &= kpos > qpos[:, None] - sliding_window
        if kv_cache.dtype == torch.float8_e4m3fn:
            kc, vc = dequantize_kv_ref(kc, k_scale, q.dtype), dequantize_kv_ref(vc, v_scale,
                                                                                q.dtype)
        group = q.shape[1] // kc.shape[1]
        kc = kc.transpose(0, 1).repeat_interleave(group, dim=0).to(q.dtype)  # [nq, seq, hd]
        vc = vc.transpose(0, 1).repeat_interleave(group, dim=0).to(q.dtype)
        o = F.scaled_dot_product_attention(q[start:end].transpose(0, 1), kc, vc,
                                           attn_mask=mask, scale=scale)  # [nq, q_len, hd]
        out[start:end] = o.transpose(0, 1)
    return out
