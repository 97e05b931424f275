"""GGUF decode GEMV on int8 dot products: y = x @ W.T for a few tokens, W raw GGUF blocks.

Mirrors vLLM's GGUF vector path (csrc/quantization/gguf/gguf_kernel.cu ggml_mul_mat_vec_a8:
quantize_row_q8_1 then mul_mat_vec_q with the vec_dot_*_q8_1 functions of
csrc/quantization/gguf/vecdotq.cuh, which are llama.cpp's mmvq; vLLM 0.33 moved GGUF to
vllm-gguf-plugin, and sgl-kernel ships the same op), in Triton with own code:

1. quantize_q8_1: each group of 32 activations becomes 32 int8 values
   q = rint(x * 127 / max|x|) (scale d = max|x| / 127), packed four to an int32 word, plus
   d and the true sums of x over each 16 values (q8_1's `ds`, split in halves so Q6_K's
   16-value sub-blocks have theirs). With silu_and_mul the input is a gated MLP's gate_up
   row and the activation is made first, rounded as kernels/activation.py rounds: the down
   projection needs no extra kernel.
2. gguf_mmvq_q8_1: per weight row, the quantized values are read as 32-bit words (four
   8-bit values, or eight nibbles unpacked with two masks) and multiplied into the q8_1
   words with dp4a (4 products and a sum in one instruction), then each sub-block's
   integer sum gets its scales once: sum_u a_u * d_x * dot_u + b_u * sum_x_u, where
   w = a_u * q + b_u on the sub-block u. About one instruction a weight, against ~11 for
   the fp32 unpacking of kernels/gguf_gemm.py (docs/kernels.md), which keeps the other
   types. M tokens are padded to a power of two (BLOCK_M); the pad rows recompute the last
   token, which costs ALU work only (the weights are read once).

Types: Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K (MMVQ_TYPES). Layouts of the work (MmvqConfig.layout):
0, the steps below (two lanes a sub-block; blocks of 2-byte alignment read as 16-bit
halves); 1, the default, kernels/gguf_mmvq_lanes.py (a lane per sub-block, aligned words;
docs/kernels.md has the SASS of both); 2, layout 1 with the weights read past L1. The
error is the int8 rounding of the activations (about 1e-2 relative, what llama.cpp and
vLLM accept); with activations that are small integers (d = 1) the result equals the fp32
reference. Under TRITON_INTERPRET the dp4a is emulated with shifts (the interpreter runs
no PTX). Row offsets are 64-bit and N, K come from the tensors' own shapes
(CVE-2026-53923).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from libvllm.kernels import envs
from libvllm.kernels._common import (
    cdiv,
    check,
    check_float,
    check_same_device,
    pdl_launch,
    pdl_wait,
)
from libvllm.kernels.ggml_types import GGML_TYPE_TRAITS, GGMLType
from libvllm.kernels.gguf_mmvq_lanes import (
    dp4a_emulated,
    kquant_lane_step,
    legacy_lane_step,
    q6k_lane_step,
)
from libvllm.kernels.gguf_tiles import Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, Q8_0
from libvllm.kernels.launch_cache import cached_launch
from libvllm.kernels.launch_configs import MmvqConfig

MMVQ_TYPES = frozenset({Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K})  # block sizes: GGML_TYPE_TRAITS
MMVQ_MAX_M = 8  # decode rows; more go through kernels/gguf_gemm.py


MMVQ_NARROW_N = 4096  # K-quant layers with up to this many outputs: two rows a program
MMVQ_WIDE_N = 16384  # Q8_0 layers with at least this many outputs: two rows a program
MMVQ_TINY_N = 1024  # Q6_K layers with up to this many outputs: one row a program


@functools.lru_cache(maxsize=256)
def mmvq_config(qtype: int, n: int) -> MmvqConfig:
    """gguf_mmvq_q8_1's launch for n outputs, by rule: few rows and one warp a program
    (many programs in flight hide each step's memory latency). Q4_K / Q5_K: 2 rows of 4
    blocks for n <= MMVQ_NARROW_N, else 4; Q6_K: one row of 8 blocks for n <=
    MMVQ_TINY_N, else as Q4_K; Q8_0: 2 rows of 32 blocks for n >= MMVQ_WIDE_N, else one
    row of 64; all four in layout 1 (kernels/gguf_mmvq_lanes.py). Q4_0 / Q4_1: one row
    of 32 blocks in layout 0. Measured by `python3 examples/bench/gguf_mmvq.py --sweep
    --m 1`."""
    narrow = n <= MMVQ_NARROW_N
    if qtype in (Q4_K, Q5_K):
        return MmvqConfig(2, 4, 1, 1) if narrow else MmvqConfig(4, 4, 1, 1)
    if qtype == Q6_K:
        return MmvqConfig(1, 8, 1, 1) if n <= MMVQ_TINY_N else \
            MmvqConfig(2, 4, 1, 1) if narrow else MmvqConfig(4, 4, 1, 1)
    if qtype == Q8_0:
        return MmvqConfig(2, 32, 1, 1) if n >= MMVQ_WIDE_N else MmvqConfig(1, 64, 1, 1)
    return MmvqConfig(1, 32, 1, 0)  # Q4_0, Q4_1


@triton.jit
def _dp4a(a, b, SIGNED: tl.constexpr, ASM: tl.constexpr):
    """Per int32 element: sum of the 4 byte products of a (unsigned bytes, or signed when
    SIGNED) and b (signed bytes)."""
    if ASM:
        if SIGNED:
            s = tl.inline_asm_elementwise("dp4a.s32.s32 $0, $1, $2, 0;", "=r,r,r", [a, b],
                                          dtype=tl.int32, is_pure=True, pack=1)
        else:
            s = tl.inline_asm_elementwise("dp4a.u32.s32 $0, $1, $2, 0;", "=r,r,r", [a, b],
                                          dtype=tl.int32, is_pure=True, pack=1)
    else:
        s = dp4a_emulated(a, b, a * 0 + b * 0, SIGNED)
    return s


@triton.jit
def _word16(ptr, mask):
    """The little-endian int32 at a 2-byte aligned byte pointer, from two 16-bit loads."""
    p = ptr.to(tl.pointer_type(tl.int16))
    lo = tl.load(p, mask=mask, other=0).to(tl.int32) & 0xFFFF
    return lo | (tl.load(p + 1, mask=mask, other=0).to(tl.int32) << 16)


@triton.jit
def _word32(ptr, mask):
    """The int32 at a 4-byte aligned byte pointer."""
    return tl.load(ptr.to(tl.pointer_type(tl.int32)), mask=mask, other=0)


@triton.jit
def _f16(ptr, mask):
    return tl.load(ptr.to(tl.pointer_type(tl.float16)), mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _kquant_scales(base, mask, h: tl.constexpr):
    """6-bit (scale, min) of the sub-blocks j = 2c + h (c = 0..3) of block_q4_K / q5_K at
    `base` [BN, NB, 1] (get_scale_min_k4 on the 12 bytes at +4) -> two [BN, NB, 4] fp32."""
    a = _word32(base + 4, mask)
    b = _word32(base + 8, mask)
    c = _word32(base + 12, mask)
    j = 2 * tl.arange(0, 4)[None, None, :] + h
    sh = 8 * (j % 4)
    sc = tl.where(j < 4, (a >> sh) & 63, ((c >> sh) & 15) | (((a >> (sh + 6)) & 3) << 4))
    mn = tl.where(j < 4, (b >> sh) & 63, ((c >> (sh + 4)) & 15) | (((b >> (sh + 6)) & 3) << 4))
    return sc.to(tl.float32), mn.to(tl.float32)


@triton.jit
def _accumulate(acc, r, mi: tl.constexpr, BLOCK_M: tl.constexpr):
    """One token: acc is r's shape [BN, ...] (summed once after the loop: no cross-lane
    reduction per step). More tokens: acc [BN, BLOCK_M] gets r summed to [BN] in column mi."""
    if BLOCK_M == 1:
        acc += r
    else:
        r = tl.sum(tl.reshape(r, (r.shape[0], r.numel // r.shape[0])), 1)
        acc += tl.where(tl.arange(0, BLOCK_M)[None, :] == mi, r[:, None], 0.0)
    return acc


@triton.jit
def _kquant_step(acc, rows, x, blk0, nblk, n_mask, M, BLOCK_M: tl.constexpr, NB: tl.constexpr,
                 HAS_QH: tl.constexpr, ASM: tl.constexpr):
    # block_q4_K (144 B): d | dmin | scales[12] | qs[128]; q5_K (176 B) has qh[32] before qs.
    # qs word 8c + i: bytes 32c + 4i..: low nibbles = values 64c + 4i.., high = 64c + 32 + 4i..
    # rows [BN, 1, 1]; x = (xq, xd, xs) of token 0 and their row strides. -> [BN, BLOCK_M]
    SIZE: tl.constexpr = 176 if HAS_QH else 144
    QS: tl.constexpr = 48 if HAS_QH else 16
    s = blk0 + tl.arange(0, NB)[None, :, None]  # [1, NB, 1]
    m = n_mask & (s < nblk)  # [BN, NB, 1]
    base = rows + s.to(tl.int64) * SIZE  # [BN, NB, 1]
    c = tl.arange(0, 4)[None, None, :, None]
    i = tl.arange(0, 8)[None, None, None, :]
    w = _word32(base[:, :, :, None] + QS + 32 * c + 4 * i, m[:, :, :, None])  # [BN, NB, 4, 8]
    lo = w & 0x0F0F0F0F
    hi = (w >> 4) & 0x0F0F0F0F
    if HAS_QH:  # fifth bit of value l of sub-block j: bit j of qh[l]
        qh = _word32(base[:, :, :, None] + 16 + 4 * i, m[:, :, :, None])  # [BN, NB, 1, 8]
        lo = lo | (((qh >> (2 * c)) & 0x01010101) << 4)
        hi = hi | (((qh >> (2 * c + 1)) & 0x01010101) << 4)
    sc_lo, mn_lo = _kquant_scales(base, m, 0)
    sc_hi, mn_hi = _kquant_scales(base, m, 1)
    d = _f16(base, m)
    sc_lo, sc_hi = d * sc_lo, d * sc_hi
    dmin = _f16(base + 2, m)
    mn_lo, mn_hi = dmin * mn_lo, dmin * mn_hi  # [BN, NB, 4]
    xm = s < nblk
    xw = s[:, :, :, None] * 64 + 16 * c + i  # [1, NB, 4, 8] word of the low half
    g = s * 8 + 2 * tl.arange(0, 4)[None, None, :]  # [1, NB, 4] q8_1 group of the low half
    xq, xd, xs, sq, sd, ss = x
    for mi in tl.static_range(BLOCK_M):
        t = tl.minimum(mi, M - 1).to(tl.int64)  # rows past M recompute the last one
        q_lo = tl.load(xq + t * sq + xw, mask=xm[:, :, :, None], other=0)
        q_hi = tl.load(xq + t * sq + xw + 8, mask=xm[:, :, :, None], other=0)
        dot_lo = tl.sum(_dp4a(lo, q_lo, False, ASM), 3).to(tl.float32)  # [BN, NB, 4]
        dot_hi = tl.sum(_dp4a(hi, q_hi, False, ASM), 3).to(tl.float32)
        xs_t = xs + t * ss + 2 * g
        s_lo = tl.load(xs_t, mask=xm, other=0.0) + tl.load(xs_t + 1, mask=xm, other=0.0)
        s_hi = tl.load(xs_t + 2, mask=xm, other=0.0) + tl.load(xs_t + 3, mask=xm, other=0.0)
        r = sc_lo * tl.load(xd + t * sd + g, mask=xm, other=0.0) * dot_lo \
            + sc_hi * tl.load(xd + t * sd + g + 1, mask=xm, other=0.0) * dot_hi \
            - (mn_lo * s_lo + mn_hi * s_hi)
        acc = _accumulate(acc, r, mi, BLOCK_M)
    return acc


@triton.jit
def _q6_k_half(acc, ql, qh, base, d, m, v0, x, mi: tl.constexpr, M, BQ: tl.constexpr,
               BLOCK_M: tl.constexpr, ASM: tl.constexpr):
    # values of nibble BQ of the ql words [BN, NB, 2, 2, 2, 4] (g = 2 BQ + a): 6-bit q, its
    # scale and q8_1 dot; v0 [1, NB, 2, 2, 2, 1] = first value of each 16 for BQ = 0; d is 0
    # on masked blocks
    a = tl.arange(0, 2)[None, None, None, :, None, None]
    q = ((ql >> (4 * BQ)) & 0x0F0F0F0F) | (((qh >> (2 * (2 * BQ + a))) & 0x03030303) << 4)
    v = v0 + 64 * BQ
    sc = tl.load((base + 192 + (v % 256) // 16).to(tl.pointer_type(tl.int8)), mask=m,
                 other=0).to(tl.float32) * d  # d * scales[(value % 256) / 16]
    xq, xd, xs, sq, sd, ss = x
    t = tl.minimum(mi, M - 1).to(tl.int64)  # rows past M recompute the last one
    qx = tl.load(xq + t * sq + v // 4 + tl.arange(0, 4)[None, None, None, None, None, :])
    dot = tl.sum(_dp4a(q, qx, False, ASM), 5, keep_dims=True).to(tl.float32)
    dx = tl.load(xd + t * sd + v // 32)
    sx = tl.load(xs + t * ss + v // 16)
    return _accumulate(acc, sc * (dx * dot - 32.0 * sx), mi, BLOCK_M)  # [BN, NB, 2, 2, 2, 1]


@triton.jit
def _q6_k_step(acc, rows, x, blk0, nblk, n_mask, M, BLOCK_M: tl.constexpr, NB: tl.constexpr,
               ASM: tl.constexpr):
    # block_q6_K (210 B): ql[128] | qh[64] | scales[16] int8 | d. Value 128 h2 + 32 g + 16 j
    # + 4 i + e (g = 2 bq + a): low 4 bits = nibble bq of ql[64 h2 + 32 a + 16 j + 4 i + e],
    # high 2 bits = bits 2g of qh[32 h2 + 16 j + 4 i + e]; scale scales[8 h2 + 2 g + j];
    # w = d sc (q - 32). Axes (row, block, h2, a, j, i): each ql word feeds two nibbles (bq),
    # each qh word four; rows [BN, 1, 1, 1, 1, 1] -> acc
    s = blk0 + tl.arange(0, NB)[None, :, None, None, None, None]
    m = n_mask & (s < nblk)  # [BN, NB, 1, 1, 1, 1]
    s = tl.minimum(s, nblk - 1)  # past the row: re-read its last block, weights masked to 0
    base = rows + s.to(tl.int64) * 210
    h2 = tl.arange(0, 2)[None, None, :, None, None, None]
    a = tl.arange(0, 2)[None, None, None, :, None, None]
    j = tl.arange(0, 2)[None, None, None, None, :, None]
    i = tl.arange(0, 4)[None, None, None, None, None, :]
    ql = _word16(base + 64 * h2 + 32 * a + 16 * j + 4 * i, m)  # [BN, NB, 2, 2, 2, 4]
    qh = _word16(base + 128 + 32 * h2 + 16 * j + 4 * i, m)  # [BN, NB, 2, 1, 2, 4]
    d = _f16(base + 208, m)  # [BN, NB, 1, 1, 1, 1], 0 where masked
    v0 = s * 256 + 128 * h2 + 32 * a + 16 * j  # [1, NB, 2, 2, 2, 1]
    for mi in tl.static_range(BLOCK_M):
        acc = _q6_k_half(acc, ql, qh, base, d, m, v0, x, mi, M, 0, BLOCK_M, ASM)
        acc = _q6_k_half(acc, ql, qh, base, d, m, v0, x, mi, M, 1, BLOCK_M, ASM)
    return acc


@triton.jit
def _legacy_step(acc, rows, x, blk0, nblk, n_mask, M, BLOCK_M: tl.constexpr, NB: tl.constexpr,
                 TYPE: tl.constexpr, ASM: tl.constexpr):
    # block_q8_0 (34 B): d | qs[32] int8 (w = d q); block_q4_0 (18 B): d | qs[16] (low
    # nibbles = values 0..15, high = 16..31, w = d (q - 8)); block_q4_1 (20 B): d | m | qs[16]
    # (w = d q + m). One q8_1 group per block. rows [BN, 1, 1] -> [BN, BLOCK_M]
    SIZE: tl.constexpr = 34 if TYPE == 8 else (18 if TYPE == 2 else 20)
    W: tl.constexpr = 8 if TYPE == 8 else 4  # weight words per block
    s = blk0 + tl.arange(0, NB)[None, :, None]  # [1, NB, 1]
    m = n_mask & (s < nblk)  # [BN, NB, 1]
    base = rows + s.to(tl.int64) * SIZE
    i = tl.arange(0, W)[None, None, :]
    if TYPE == 3:
        w = _word32(base + 4 + 4 * i, m)  # [BN, NB, W]
    else:
        w = _word16(base + 2 + 4 * i, m)
    d = _f16(base, m)  # [BN, NB, 1]
    if TYPE == 2:
        off = -8.0 * d
    else:
        off = _f16(base + 2, m)
    xm = s < nblk
    xq, xd, xs, sq, sd, ss = x
    for mi in tl.static_range(BLOCK_M):
        t = tl.minimum(mi, M - 1).to(tl.int64)
        qx = xq + t * sq + s * 8 + i
        if TYPE == 8:
            dot = tl.sum(_dp4a(w, tl.load(qx, mask=xm, other=0), True, ASM), 2,
                         keep_dims=True)
        else:
            dot = tl.sum(_dp4a(w & 0x0F0F0F0F, tl.load(qx, mask=xm, other=0), False, ASM)
                         + _dp4a((w >> 4) & 0x0F0F0F0F, tl.load(qx + 4, mask=xm, other=0),
                                 False, ASM), 2, keep_dims=True)
        r = d * tl.load(xd + t * sd + s, mask=xm, other=0.0) * dot.to(tl.float32)
        if TYPE != 8:
            xs_t = xs + t * ss + 2 * s
            r += off * (tl.load(xs_t, mask=xm, other=0.0) + tl.load(xs_t + 1, mask=xm,
                                                                     other=0.0))
        acc = _accumulate(acc, r, mi, BLOCK_M)  # [BN, NB, 1]
    return acc


@triton.jit
def _lane_loop(acc, w_ptr, xq_ptr, xd_ptr, xs_ptr, x, n, N, nblk, stride_w, M, TYPE: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, NB: tl.constexpr,
               STREAM: tl.constexpr, ASM: tl.constexpr):
    # LAYOUT 1, 2 (kernels/gguf_mmvq_lanes.py; 2 streams the weights past L1): whole steps
    # unmasked, then the partial one; rows past N re-read row N - 1 (outputs not stored)
    sq, sd, ss = x[3], x[4], x[5]
    nfull = nblk // NB
    rows = tl.minimum(n, N - 1).to(tl.int64)[:, None, None, None] * stride_w  # bytes
    w32 = w_ptr.to(tl.pointer_type(tl.int32))
    wrow = w32 + (rows >> 2)  # aligned words and each row's phase (2-byte aligned types)
    rph = (rows & 2).to(tl.int32)
    if TYPE == 2 or TYPE == 3 or TYPE == 8:
        for k in range(0, nfull):
            acc = legacy_lane_step(acc, wrow, rph, xq_ptr, xd_ptr, xs_ptr, sq, sd, ss, k, nblk,
                                   M, BLOCK_N, NB, BLOCK_M, TYPE, False, STREAM, ASM)
        if nfull * NB < nblk:
            acc = legacy_lane_step(acc, wrow, rph, xq_ptr, xd_ptr, xs_ptr, sq, sd, ss, nfull,
                                   nblk, M, BLOCK_N, NB, BLOCK_M, TYPE, True, STREAM, ASM)
    elif TYPE == 14:
        for k in range(0, nfull):
            acc = q6k_lane_step(acc, wrow, rph, xq_ptr, xd_ptr, xs_ptr, sq, sd, ss, k, nblk, M,
                                BLOCK_N, NB, BLOCK_M, False, STREAM, ASM)
        if nfull * NB < nblk:
            acc = q6k_lane_step(acc, wrow, rph, xq_ptr, xd_ptr, xs_ptr, sq, sd, ss, nfull, nblk,
                                M, BLOCK_N, NB, BLOCK_M, True, STREAM, ASM)
    else:
        SIZE: tl.constexpr = 44 if TYPE == 13 else 36  # 32-bit words
        wb = w32 + (rows // 4) + tl.arange(0, NB)[None, :, None, None] * SIZE  # [BN, NB, 1, 1]
        for k in range(0, nfull):
            acc = kquant_lane_step(acc, wb, xq_ptr, xd_ptr, xs_ptr, sq, sd, ss, k, nblk, M,
                                   BLOCK_N, NB, BLOCK_M, TYPE == 13, False, STREAM, ASM)
        if nfull * NB < nblk:
            acc = kquant_lane_step(acc, wb, xq_ptr, xd_ptr, xs_ptr, sq, sd, ss, nfull, nblk, M,
                                   BLOCK_N, NB, BLOCK_M, TYPE == 13, True, STREAM, ASM)
    return acc


@cached_launch
@triton.jit
def _mmvq_kernel(
    xq_ptr, xd_ptr, xs_ptr, w_ptr, y_ptr, M, N, nblk, stride_w: tl.int64, stride_ym: tl.int64,
    TYPE: tl.constexpr, GPB: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
    NB: tl.constexpr, LAYOUT: tl.constexpr, ASM: tl.constexpr, USE_PDL: tl.constexpr,
):
    # program: BLOCK_N weight rows x all M (<= BLOCK_M) tokens; xq [M, K / 4] int32,
    # xd [M, K / 32], xs [M, K / 16] fp32 -> y [M, N] (row stride stride_ym: a slice of a
    # wider output); GPB q8_1 groups per weight block
    if USE_PDL:  # the kernel before wrote this one's inputs
        pdl_wait()
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k32 = nblk * GPB
    x = (xq_ptr, xd_ptr, xs_ptr, k32 * 8, k32, k32 * 2)  # pointers and row strides
    if BLOCK_M > 1:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    elif LAYOUT >= 1:
        acc = tl.zeros([BLOCK_N, NB, 4 if TYPE >= 12 else 1], dtype=tl.float32)
    elif TYPE == 14:
        acc = tl.zeros([BLOCK_N, NB, 2, 2, 2, 1], dtype=tl.float32)
    elif TYPE == 12 or TYPE == 13:
        acc = tl.zeros([BLOCK_N, NB, 4], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_N, NB, 1], dtype=tl.float32)
    if LAYOUT >= 1:
        acc = _lane_loop(acc, w_ptr, xq_ptr, xd_ptr, xs_ptr, x, n, N, nblk, stride_w, M, TYPE,
                         BLOCK_N, BLOCK_M, NB, LAYOUT == 2, ASM)
    else:
        for blk0 in range(0, nblk, NB):
            if TYPE == 14:
                rows = w_ptr + n.to(tl.int64)[:, None, None, None, None, None] * stride_w
                acc = _q6_k_step(acc, rows, x, blk0, nblk, (n < N)[:, None, None, None, None, None],
                                 M, BLOCK_M, NB, ASM)
            elif TYPE == 12 or TYPE == 13:
                rows = w_ptr + n.to(tl.int64)[:, None, None] * stride_w
                acc = _kquant_step(acc, rows, x, blk0, nblk, (n < N)[:, None, None], M, BLOCK_M,
                                   NB, TYPE == 13, ASM)
            else:
                rows = w_ptr + n.to(tl.int64)[:, None, None] * stride_w
                acc = _legacy_step(acc, rows, x, blk0, nblk, (n < N)[:, None, None], M, BLOCK_M,
                                   NB, TYPE, ASM)
    if BLOCK_M == 1:  # the one reduction of the tile
        acc = tl.sum(tl.reshape(acc, (BLOCK_N, acc.numel // BLOCK_N)), 1)[:, None]
    om = tl.arange(0, BLOCK_M)
    y = y_ptr + om.to(tl.int64)[None, :] * stride_ym + n[:, None]
    tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=(n < N)[:, None] & (om < M)[None, :])


@cached_launch
@triton.jit
def _quantize_q8_1_kernel(
    x_ptr, xq_ptr, xd_ptr, xs_ptr, K, stride_x: tl.int64, G: tl.constexpr,
    SILU_AND_MUL: tl.constexpr, USE_PDL: tl.constexpr,
):
    # program: G groups of 32 values of one token; x row [K] (or gate_up [2K]) ->
    # xq [K / 4] int32, xd [K / 32], xs [K / 16] fp32
    if USE_PDL:
        pdl_wait()
    tok = tl.program_id(1).to(tl.int64)
    g = tl.program_id(0) * G + tl.arange(0, G)[:, None]  # [G, 1]
    k = g * 32 + tl.arange(0, 32)[None, :]  # [G, 32]
    mask = k < K
    a = tl.load(x_ptr + tok * stride_x + k, mask=mask, other=0.0)
    if SILU_AND_MUL:  # as kernels/activation.py: silu rounded, the product rounded
        af = a.to(tl.float32)
        silu = (af / (1.0 + tl.exp(-af))).to(a.dtype).to(tl.float32)
        up = tl.load(x_ptr + tok * stride_x + K + k, mask=mask, other=0.0)
        a = (silu * up.to(tl.float32)).to(a.dtype)
    x = a.to(tl.float32)
    amax = tl.max(tl.abs(x), 1)  # [G]
    d = amax / 127.0
    inv = tl.where(amax > 0, tl.div_rn(tl.full([G], 127.0, tl.float32),
                                       tl.where(amax > 0, amax, 1.0)), 0.0)
    q = ((x * inv[:, None] + 12582912.0) - 12582912.0).to(tl.int32)  # rint, |q| <= 127
    words = tl.sum(tl.reshape(q & 0xFF, (G, 8, 4)) << (8 * tl.arange(0, 4))[None, None, :], 2)
    gm = g < K // 32
    tl.store(xq_ptr + tok * (K // 4) + g * 8 + tl.arange(0, 8)[None, :], words, mask=gm)
    tl.store(xd_ptr + tok * (K // 32) + g, d[:, None], mask=gm)
    sums = tl.sum(tl.reshape(x, (G, 2, 16)), 2)  # [G, 2]
    tl.store(xs_ptr + tok * (K // 16) + 2 * g + tl.arange(0, 2)[None, :], sums, mask=gm)


def _asm() -> bool:
    return not envs.TRITON_INTERPRET


def quantize_q8_1(x: torch.Tensor, silu_and_mul: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [M, K] (or gate_up [M, 2K] with silu_and_mul), K a multiple of 32 ->
    (xq [M, K / 4] int32, xd [M, K / 32] fp32, xs [M, K / 16] fp32)."""
    check_float("x", x)
    check(x.dim() == 2 and x.stride(1) == 1, "x must be [num_tokens, K], last dim contiguous")
    m, k = x.shape[0], x.shape[1] // (2 if silu_and_mul else 1)
    check(not silu_and_mul or x.shape[1] % 2 == 0,
          lambda: f"gate_up must be [num_tokens, 2K], got width {x.shape[1]}")
    check(k % 32 == 0, lambda: f"x's K = {k} must be a multiple of 32 (q8_1 groups)")
    xq = torch.empty(m, k // 4, dtype=torch.int32, device=x.device)
    xd = torch.empty(m, k // 32, dtype=torch.float32, device=x.device)
    xs = torch.empty(m, k // 16, dtype=torch.float32, device=x.device)
    if m and k:
        groups = 16
        _quantize_q8_1_kernel[(cdiv(k // 32, groups), m)](
            x, xq, xd, xs, k, x.stride(0), G=groups, SILU_AND_MUL=silu_and_mul,
            num_warps=4, **pdl_launch(x))
    return xq, xd, xs


def gguf_mmvq_q8_1(xq8: tuple[torch.Tensor, torch.Tensor, torch.Tensor], qweight: torch.Tensor,
                   qtype: int, out: torch.Tensor,
                   config: MmvqConfig | None = None) -> torch.Tensor:
    """out [M, N] (may be a column slice of a wider tensor) = x @ W.T from x's q8_1 form
    (quantize_q8_1) and raw blocks qweight [N, row_bytes] uint8 of type qtype."""
    xq, xd, xs = xq8
    check(qtype in MMVQ_TYPES, lambda: f"no int8 GEMV for GGML type {qtype}")
    block, size = GGML_TYPE_TRAITS[GGMLType(qtype)]
    check(qweight.dtype == torch.uint8 and qweight.dim() == 2 and qweight.stride(1) == 1
          and qweight.shape[1] % size == 0,
          lambda: f"qweight must be [N, whole {size}-byte blocks] uint8, got "
          f"{tuple(qweight.shape)} {qweight.dtype}")
    n, nblk = qweight.shape[0], qweight.shape[1] // size
    align = 4 if size % 4 == 0 else 2
    check(qweight.stride(0) % align == 0 and qweight.data_ptr() % align == 0,
          lambda: f"qweight rows must be {align}-byte aligned")
    m = xq.shape[0]
    k = nblk * block
    check(xq.shape == (m, k // 4) and m <= MMVQ_MAX_M,
          lambda: f"x (q8_1 {tuple(xq.shape)}) does not match K = {k}, or has more "
          f"than {MMVQ_MAX_M} rows")
    check(xq.dtype == torch.int32 and xq.is_contiguous() and xd.shape == (m, k // 32)
          and xs.shape == (m, k // 16) and xd.dtype == xs.dtype == torch.float32
          and xd.is_contiguous() and xs.is_contiguous(),
          "x's q8_1 form must be quantize_q8_1's (xq int32, xd and xs fp32, contiguous)")
    check_float("out", out)
    check(out.shape == (m, n) and out.stride(1) == 1, lambda: f"out must be [{m}, {n}]")
    check_same_device(xq=xq, xd=xd, xs=xs, qweight=qweight, out=out)
    if m == 0 or n == 0:
        return out
    cfg = config or mmvq_config(qtype, n)
    block_n, nb, warps = cfg.block_n, cfg.blocks, cfg.num_warps
    # layouts 1, 2 read 2-byte aligned blocks as the aligned words around them
    lanes = cfg.layout if qweight.data_ptr() % 4 == 0 else 0
    _mmvq_kernel[(cdiv(n, block_n),)](
        xq, xd, xs, qweight, out, m, n, nblk, qweight.stride(0), out.stride(0), TYPE=qtype,
        GPB=block // 32, BLOCK_N=block_n, BLOCK_M=1 << (m - 1).bit_length(), NB=nb,
        LAYOUT=lanes, ASM=_asm(),
        num_warps=warps, **pdl_launch(out))
    return out


def gguf_mmvq(x: torch.Tensor, qweight: torch.Tensor, qtype: int, silu_and_mul: bool = False,
              config: MmvqConfig | None = None) -> torch.Tensor:
    """y [M, N] = act(x) @ W.T for M <= MMVQ_MAX_M: quantize_q8_1, then gguf_mmvq_q8_1."""
    n = qweight.shape[0]
    out = torch.empty(x.shape[0], n, dtype=x.dtype, device=x.device)
    return gguf_mmvq_q8_1(quantize_q8_1(x, silu_and_mul), qweight, qtype, out, config)


def quantize_q8_1_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """quantize_q8_1 in torch (fp32 math): x [M, K] -> (int8 values [M, K], d [M, K / 32],
    sums [M, K / 16])."""
    g = x.float().reshape(x.shape[0], -1, 32)
    amax = g.abs().amax(-1)
    inv = torch.where(amax > 0, 127.0 / torch.where(amax > 0, amax, 1.0), 0.0)
    q = torch.round(g * inv[..., None]).to(torch.int8)
    return q.reshape(x.shape), amax / 127.0, g.reshape(x.shape[0], -1, 16).sum(-1)
