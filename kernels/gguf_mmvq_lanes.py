"""Lane-per-unit steps of the int8-dot GGUF GEMV (kernels/gguf_mmvq.py, LAYOUT = 1).

The steps of kernels/gguf_mmvq.py spread one sub-block's 8 weight words over two lanes, so
each sub-block's integer sum costs warp shuffles, and recompute every address from the block
index. Here each lane owns whole units of a block (the dp4a chain stays in the lane), reads
its block header itself (the lanes of one block hit the same L1 line) and decodes only its
own scales; addresses are a loop-invariant tensor plus one scalar offset per step, and only
the last, partial step is masked. Tensors are [BN, NB, U, 4]: rows, blocks, units of a
block (across lanes) and 4 consecutive 32-bit words (in one lane), every load of a step in
that shape so that Triton gives them one layout.

- Q4_K / Q5_K (U = 4): unit c holds qs bytes 32c..32c+31, the low nibbles of sub-block 2c
  and the high nibbles of 2c + 1; the high nibbles are multiplied in place
  (w & 0xF0F0F0F0, 16x the value) and the 1/16 goes into the fp32 scale. Q5_K's fifth
  bits are masked in place too (bit 2c or 2c + 1 of each qh byte) and dotted separately.
- Q6_K (U = 4, 2-byte aligned blocks): unit (h2, j) holds 16 values of each of the 4
  groups of half h2; each 16-byte span is read as the 5 aligned words around it,
  funnel-shifted by the block's phase; low 4 and high 2 bits are dotted in place.
- Q8_0, Q4_0, Q4_1 (U = 1): a lane per block, Q8_0 and Q4_0 through the same funnel.
Same math as llama.cpp's vec_dot_*_q8_1 (vLLM csrc/quantization/gguf/vecdotq.cuh).
"""

from __future__ import annotations

import triton
import triton.language as tl

HI4 = tl.constexpr(-0x0F0F0F10)  # 0xF0F0F0F0 as an int32 (a wider literal would promote to int64)


@triton.jit
def dp4a(a, b, c, SIGNED: tl.constexpr, ASM: tl.constexpr):
    """Per int32 element: c + the sum of the 4 byte products of a (unsigned bytes, or signed
    when SIGNED) and b (signed bytes)."""
    if ASM:
        c = c + a * 0  # a tensor of a's shape (folded away)
        if SIGNED:
            s = tl.inline_asm_elementwise("dp4a.s32.s32 $0, $1, $2, $3;", "=r,r,r,r",
                                          [a, b, c], dtype=tl.int32, is_pure=True, pack=1)
        else:
            s = tl.inline_asm_elementwise("dp4a.u32.s32 $0, $1, $2, $3;", "=r,r,r,r",
                                          [a, b, c], dtype=tl.int32, is_pure=True, pack=1)
    else:
        s = dp4a_emulated(a, b, c + a * 0 + b * 0, SIGNED)
    return s


@triton.jit
def dp4a_emulated(a, b, c, SIGNED: tl.constexpr):
    """dp4a in plain integer ops, for the interpreter: c + the 4 byte products of a and b."""
    s = c
    for i in tl.static_range(4):
        if SIGNED:
            ai = (a << (24 - 8 * i)) >> 24
        else:
            ai = (a >> (8 * i)) & 0xFF
        s += ai * ((b << (24 - 8 * i)) >> 24)
    return s


@triton.jit
def split4(t, S0: tl.constexpr, S1: tl.constexpr, S2: tl.constexpr):
    """[S0, S1, S2, 4] -> its four [S0, S1, S2] slices along the last axis (in-lane)."""
    a, b = tl.split(tl.reshape(t, (S0, S1, S2, 2, 2)))  # a: words 0, 2; b: 1, 3
    w0, w2 = tl.split(a)
    w1, w3 = tl.split(b)
    return w0, w1, w2, w3


@triton.jit
def add_token(acc, r, mi, BN: tl.constexpr, NB: tl.constexpr, BLOCK_M: tl.constexpr):
    """acc [BN, NB, 4] (one token) += r; or acc [BN, BLOCK_M] gets r's sum in column mi."""
    if BLOCK_M == 1:
        acc += r
    else:
        r = tl.sum(tl.reshape(r, (BN, NB * 4)), 1)
        acc += tl.where(tl.arange(0, BLOCK_M)[None, :] == mi, r[:, None], 0.0)
    return acc


@triton.jit
def chain8(w0, w1, x0, x1, BN: tl.constexpr, NB: tl.constexpr, ASM: tl.constexpr):
    """dp4a sum over the 8 words w0 | w1 ([BN, NB, 4, 4] unsigned bytes) with x0 | x1, one
    accumulator chain in each lane -> [BN, NB, 4]."""
    a0, a1, a2, a3 = split4(w0, BN, NB, 4)
    b0, b1, b2, b3 = split4(x0, BN, NB, 4)
    acc = dp4a(a3, b3, dp4a(a2, b2, dp4a(a1, b1, dp4a(a0, b0, 0, False, ASM), False, ASM),
                            False, ASM), False, ASM)
    a0, a1, a2, a3 = split4(w1, BN, NB, 4)
    b0, b1, b2, b3 = split4(x1, BN, NB, 4)
    return dp4a(a3, b3, dp4a(a2, b2, dp4a(a1, b1, dp4a(a0, b0, acc, False, ASM), False, ASM),
                             False, ASM), False, ASM)


@triton.jit
def wload(p, m, MASK: tl.constexpr, STREAM: tl.constexpr):
    """A weight load: as load, or with STREAM past L1 (ld.global.cg: read once, leaves L1
    to the activations)."""
    if STREAM:
        if MASK:
            return tl.load(p, mask=m, other=0, cache_modifier=".cg")
        return tl.load(p, cache_modifier=".cg")
    return load(p, m, MASK)


@triton.jit
def load(p, m, MASK: tl.constexpr):
    """tl.load(p), masked with m (0 where off) on a step that needs it."""
    if MASK:
        return tl.load(p, mask=m, other=0)
    return tl.load(p)


@triton.jit
def f16_lo(w):
    """fp32 of the fp16 in the low half of int32 w."""
    return w.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def kquant_lane_step(acc, wb, xq, xd, xs, sq, sd, ss, k, nblk, M, BN: tl.constexpr,
                     NB: tl.constexpr, BLOCK_M: tl.constexpr, HAS_QH: tl.constexpr,
                     MASK: tl.constexpr, STREAM: tl.constexpr, ASM: tl.constexpr):
    # block_q4_K (144 B): d | dmin | scales[12] | qs[128]; q5_K (176 B) has qh[32] before qs.
    # wb [BN, NB, 1, 1]: int32 pointers to the block starts of step 0; k: the step; xq, xd,
    # xs: token 0's q8_1 rows, sq, sd, ss their row strides -> acc [BN, NB, 4] (one token)
    # or [BN, BLOCK_M]
    SIZE: tl.constexpr = 44 if HAS_QH else 36  # words
    QS: tl.constexpr = 12 if HAS_QH else 4
    c = tl.arange(0, 4)[None, None, :, None]
    e = tl.arange(0, 4)[None, None, None, :]
    s = k * NB + tl.arange(0, NB)[None, :, None, None]  # [1, NB, 1, 1] block index
    m = s < nblk
    blk = wb + k * (NB * SIZE)  # int32 pointers [BN, NB, 1, 1]
    wp = blk + QS + 8 * c + e  # [BN, NB, 4, 4]
    w0 = wload(wp, m, MASK, STREAM)  # words 0..3 of unit c
    w1 = wload(wp + 4, m, MASK, STREAM)  # words 4..7
    hdr = wload(blk + e + 0 * c, m, MASK, STREAM)
    h0, a, b, cc = split4(hdr, BN, NB, 4)  # d | dmin, scales 0..3, 4..7, 8..11
    d = f16_lo(h0)  # [BN, NB, 4]
    dmin = f16_lo(h0 >> 16)
    # get_scale_min_k4 of sub-blocks 2c and 2c + 1, two bytes at once
    c3 = tl.arange(0, 4)[None, None, :]
    sh = 16 * (c3 % 2)
    a, b, cc = a >> sh, b >> sh, cc >> sh
    sc = tl.where(c3 < 2, a & 0x3F3F, (cc & 0x0F0F) | ((a >> 2) & 0x3030))
    mn = tl.where(c3 < 2, b & 0x3F3F, ((cc >> 4) & 0x0F0F) | ((b >> 2) & 0x3030))
    sc_lo = d * (sc & 0xFF).to(tl.float32)
    sc_hi = d * ((sc >> 8) & 0xFF).to(tl.float32) * 0.0625  # high nibbles are 16x
    mn_lo = dmin * (mn & 0xFF).to(tl.float32)
    mn_hi = dmin * ((mn >> 8) & 0xFF).to(tl.float32)
    lo0, lo1 = w0 & 0x0F0F0F0F, w1 & 0x0F0F0F0F
    hi0, hi1 = w0 & HI4, w1 & HI4
    if HAS_QH:  # the fifth bits, in place: bit 2c (low nibbles) and 2c + 1 (high) of qh
        q0 = wload(blk + 4 + e + 0 * c, m, MASK, STREAM)
        q1 = wload(blk + 8 + e + 0 * c, m, MASK, STREAM)
        bit = 0x01010101 << (2 * c)
        f_lo = 16.0 / (1 << (2 * c3)).to(tl.float32)  # dot of (bit << 2c) -> 16x the dot
        f_hi = f_lo * 0.5 * 16.0  # high nibbles are 16x, the bit sits at 2c + 1
    # x pointers with the rows' shape: every load of the step gets one layout (4 words a lane)
    z = tl.zeros([BN, NB, 1, 1], tl.int32)
    xw = xq + z + s * 64 + 16 * c + e  # [BN, NB, 4, 4] the unit's low-nibble words
    xg = xd + z + s * 8 + 2 * c + tl.arange(0, 2)[None, None, None, :]  # [BN, NB, 4, 2]
    xh = xs + z + s * 16 + 4 * c + e  # [BN, NB, 4, 4] sums of each 16
    for mi in tl.static_range(BLOCK_M):
        t = tl.minimum(mi, M - 1).to(tl.int64)  # rows past M recompute the last one
        xl0 = load(xw + t * sq, m, MASK)
        xl1 = load(xw + t * sq + 4, m, MASK)
        xh0 = load(xw + t * sq + 8, m, MASK)
        xh1 = load(xw + t * sq + 12, m, MASK)
        f_dot_lo = chain8(lo0, lo1, xl0, xl1, BN, NB, ASM).to(tl.float32)
        f_dot_hi = chain8(hi0, hi1, xh0, xh1, BN, NB, ASM).to(tl.float32)
        if HAS_QH:
            b_lo = chain8(q0 & bit, q1 & bit, xl0, xl1, BN, NB, ASM)
            b_hi = chain8(q0 & (bit << 1), q1 & (bit << 1), xh0, xh1, BN, NB, ASM)
            f_dot_lo += b_lo.to(tl.float32) * f_lo
            f_dot_hi += b_hi.to(tl.float32) * f_hi
        g0, g1 = tl.split(load(xg + t * sd, m, MASK))  # d of the two q8_1 groups
        s0, s1, s2, s3 = split4(load(xh + t * ss, m, MASK), BN, NB, 4)
        r = sc_lo * g0 * f_dot_lo + sc_hi * g1 * f_dot_hi - (mn_lo * (s0 + s1)
                                                            + mn_hi * (s2 + s3))
        acc = add_token(acc, r, mi, BN, NB, BLOCK_M)
    return acc


@triton.jit
def funnel(lo, hi, sh, ASM: tl.constexpr):
    """The int32 at byte sh / 8 (sh 0 or 16) of the 8 bytes hi:lo (shf.r.clamp)."""
    if ASM:
        return tl.inline_asm_elementwise("shf.r.clamp.b32 $0, $1, $2, $3;", "=r,r,r,r",
                                         [lo, hi, sh], dtype=tl.int32, is_pure=True, pack=1)
    return ((hi.to(tl.int64) << 32 | (lo.to(tl.int64) & 0xFFFFFFFF)) >> sh).to(tl.int32)


@triton.jit
def words5(p, m, sh, BN: tl.constexpr, NB: tl.constexpr, U: tl.constexpr, MASK: tl.constexpr,
           STREAM: tl.constexpr, ASM: tl.constexpr):
    """The 4 words at 2-byte aligned bytes: p [BN, NB, U, 1] int32 pointers to the aligned
    word at or below them, sh [BN, NB, U or 1] their start's bit in it (0, 16, or 32 for
    the next word) -> four [BN, NB, U]. Reads 5 aligned words (the fifth: one load, its 4
    copies are one)."""
    e = tl.arange(0, 4)[None, None, None, :]
    w0, w1, w2, w3 = split4(wload(p + e, m, MASK, STREAM), BN, NB, U)
    w4, _, _, _ = split4(wload(p + 4 + 0 * e, m, MASK, STREAM), BN, NB, U)
    return (funnel(w0, w1, sh, ASM), funnel(w1, w2, sh, ASM), funnel(w2, w3, sh, ASM),
            funnel(w3, w4, sh, ASM))


@triton.jit
def q6k_lane_step(acc, wrow, rph, xq, xd, xs, sq, sd, ss, k, nblk, M, BN: tl.constexpr,
                  NB: tl.constexpr, BLOCK_M: tl.constexpr, MASK: tl.constexpr,
                  STREAM: tl.constexpr, ASM: tl.constexpr):
    # block_q6_K (210 B, 2-byte aligned): ql[128] | qh[64] | scales[16] int8 | d. Unit
    # u = h2 + 2 j owns l = 16 j .. 16 j + 15 of half h2: values 128 h2 + 32 g + l (g = 0..3)
    # with low 4 bits from ql[64 h2 + l] (g = 0, 2: low, high nibble) or ql[64 h2 + 32 + l]
    # (g = 1, 3), high 2 bits = bits 2g of qh[32 h2 + l], scale scales[8 h2 + j + 2 g];
    # w = d sc (q - 32). Read as aligned words shifted by the block's phase (funnel).
    # wrow [BN, 1, 1, 1] int32 pointers to the aligned word at or below each row's start,
    # rph [BN, 1, 1, 1] that start's byte offset from it (0 or 2) -> acc as kquant_lane_step
    u = tl.arange(0, 4)[None, None, :, None]
    e = tl.arange(0, 4)[None, None, None, :]
    h2, j = u % 2, u // 2  # (u // 2, u % 2 would make the sums' loads contiguous in u)
    s = k * NB + tl.arange(0, NB)[None, :, None, None]  # [1, NB, 1, 1]
    m = s < nblk
    b = rph + s * 210  # [BN, NB, 1, 1] block start, bytes from wrow
    wp = wrow + (b >> 2)  # [BN, NB, 1, 1]
    sh = tl.reshape((b & 2) * 8, (BN, NB, 1))
    # ql words of g = 0, 2 (low, high nibbles), of g = 1, 3, and qh
    l0, l1, l2, l3 = words5(wp + 16 * h2 + 4 * j, m, sh, BN, NB, 4, MASK, STREAM, ASM)
    r0, r1, r2, r3 = words5(wp + 16 * h2 + 8 + 4 * j, m, sh, BN, NB, 4, MASK, STREAM, ASM)
    q0, q1, q2, q3 = words5(wp + 32 + 8 * h2 + 4 * j, m, sh, BN, NB, 4, MASK, STREAM, ASM)
    # scales 8 h2 .. 8 h2 + 7 in the aligned words t0 t1 t2; d in word 52
    t0, t1, t2, _ = split4(wload(wp + 48 + 2 * h2 + tl.minimum(e, 2), m, MASK, STREAM), BN, NB, 4)
    dw, _, _, _ = split4(wload(wp + 52 + 0 * (u + e), m, MASK, STREAM), BN, NB, 4)
    d = f16_lo(dw >> sh)  # [BN, NB, 4]
    j3 = tl.arange(0, 4)[None, None, :] // 2
    k0 = sh // 8 + j3  # byte of scales[8 h2 + j] in t0:t1
    sc0 = sbyte(t0, t1, k0, ASM)
    sc1 = sbyte(t0, t1, k0 + 2, ASM)
    sc2 = sbyte(t1, t2, k0, ASM)
    sc3 = sbyte(t1, t2, k0 + 2, ASM)
    xw = xq + tl.zeros([BN, NB, 1, 1], tl.int32) + s * 64 + 32 * h2 + 4 * j + e  # g = 0
    xg = xd + tl.zeros([BN, NB, 1, 1], tl.int32) + s * 8 + 4 * h2 + e  # d of g = 0..3
    xh = xs + tl.zeros([BN, NB, 1, 1], tl.int32) + s * 16 + 8 * h2 + j + 2 * e  # sums
    for mi in tl.static_range(BLOCK_M):
        t = tl.minimum(mi, M - 1).to(tl.int64)  # rows past M recompute the last one
        x0 = split4(load(xw + t * sq, m, MASK), BN, NB, 4)
        x1 = split4(load(xw + t * sq + 8, m, MASK), BN, NB, 4)
        x2 = split4(load(xw + t * sq + 16, m, MASK), BN, NB, 4)
        x3 = split4(load(xw + t * sq + 24, m, MASK), BN, NB, 4)
        # dot of q - its top 2 bits: low nibbles in place (g = 2, 3: 16x), qh bits in place
        d0 = q6_dot(l0, l1, l2, l3, 0x0F0F0F0F, q0, q1, q2, q3, 0x03030303, x0, ASM)
        d1 = q6_dot(r0, r1, r2, r3, 0x0F0F0F0F, q0, q1, q2, q3, 0x0C0C0C0C, x1, ASM)
        d2 = q6_dot(l0, l1, l2, l3, HI4, q0, q1, q2, q3, 0x30303030, x2, ASM)
        d3 = q6_dot(r0, r1, r2, r3, HI4, q0, q1, q2, q3, -0x3F3F3F40, x3, ASM)
        dot0 = d0[0] + (d0[1] << 4)
        dot1 = d1[0] + (d1[1] << 2)
        dot2 = (d2[0] >> 4) + d2[1]
        dot3 = (d3[0] + (d3[1] << 2)) >> 4
        g0, g1, g2, g3 = split4(load(xg + t * sd, m, MASK), BN, NB, 4)
        s0, s1, s2, s3 = split4(load(xh + t * ss, m, MASK), BN, NB, 4)
        r = d * (sc0 * (g0 * dot0.to(tl.float32) - 32.0 * s0)
                 + sc1 * (g1 * dot1.to(tl.float32) - 32.0 * s1)
                 + sc2 * (g2 * dot2.to(tl.float32) - 32.0 * s2)
                 + sc3 * (g3 * dot3.to(tl.float32) - 32.0 * s3))
        acc = add_token(acc, r, mi, BN, NB, BLOCK_M)
    return acc


@triton.jit
def sbyte(lo, hi, i, ASM: tl.constexpr):
    """fp32 of the int8 at byte i (0..7) of hi:lo."""
    if ASM:
        sel = i | ((i | 8) << 4) | ((i | 8) << 8) | ((i | 8) << 12)  # byte i, sign-filled
        v = tl.inline_asm_elementwise("prmt.b32 $0, $1, $2, $3;", "=r,r,r,r", [lo, hi, sel],
                                      dtype=tl.int32, is_pure=True, pack=1)
    else:
        w = tl.where(i < 4, lo, hi)
        v = (w << (24 - 8 * (i % 4))) >> 24
    return v.to(tl.float32)


@triton.jit
def q6_dot(l0, l1, l2, l3, LM: tl.constexpr, q0, q1, q2, q3, HM: tl.constexpr, x,
           ASM: tl.constexpr):
    """(dp4a sum of the low bits l & LM, of the high bits q & HM) over 4 words with x."""
    x0, x1, x2, x3 = x
    a = dp4a(l3 & LM, x3, dp4a(l2 & LM, x2, dp4a(l1 & LM, x1, dp4a(l0 & LM, x0, 0, False,
                                                                      ASM), False, ASM),
                                 False, ASM), False, ASM)
    b = dp4a(q3 & HM, x3, dp4a(q2 & HM, x2, dp4a(q1 & HM, x1, dp4a(q0 & HM, x0, 0, False,
                                                                      ASM), False, ASM),
                                 False, ASM), False, ASM)
    return a, b


@triton.jit
def legacy_lane_step(acc, wrow, rph, xq, xd, xs, sq, sd, ss, k, nblk, M, BN: tl.constexpr,
                     NB: tl.constexpr, BLOCK_M: tl.constexpr, TYPE: tl.constexpr,
                     MASK: tl.constexpr, STREAM: tl.constexpr, ASM: tl.constexpr):
    # A lane per block: block_q8_0 (34 B): d | qs[32] int8, w = d q; block_q4_0 (18 B):
    # d | qs[16] (low nibbles = values 0..15, high = 16..31), w = d (q - 8); block_q4_1
    # (20 B): d | m | qs[16], w = d q + m. Q8_0 and Q4_0 blocks are 2-byte aligned: their
    # qs are aligned words funnel-shifted by the block's phase. wrow, rph as q6k_lane_step
    # -> acc [BN, NB, 1] (one token) or [BN, BLOCK_M]
    SIZE: tl.constexpr = 34 if TYPE == 8 else (18 if TYPE == 2 else 20)
    e = tl.arange(0, 4)[None, None, None, :]
    s = k * NB + tl.arange(0, NB)[None, :, None, None]  # [1, NB, 1, 1]
    m = s < nblk
    b = rph + s * SIZE  # [BN, NB, 1, 1] block start, bytes from wrow
    wp = wrow + (b >> 2)  # [BN, NB, 1, 1] the aligned word holding d
    ph = tl.reshape(b & 2, (BN, NB, 1))  # 2: d is that word's high half
    dw, _, _, _ = split4(wload(wp + 0 * e, m, MASK, STREAM), BN, NB, 1)
    d = f16_lo(dw >> (8 * ph))  # [BN, NB, 1]
    if TYPE == 3:
        off = f16_lo(dw >> 16)  # m
        w0, w1, w2, w3 = split4(wload(wp + 1 + e, m, MASK, STREAM), BN, NB, 1)
    else:  # qs at byte 2: mid-word (phase 0) or the next word (phase 2: shift 32 = hi)
        sh = 16 + 8 * ph
        w0, w1, w2, w3 = words5(wp, m, sh, BN, NB, 1, MASK, STREAM, ASM)
        if TYPE == 8:
            w4, w5, w6, w7 = words5(wp + 4, m, sh, BN, NB, 1, MASK, STREAM, ASM)
        else:
            off = -8.0 * d
    z = tl.zeros([BN, NB, 1, 1], tl.int32)
    xw = xq + z + s * 8 + e  # [BN, NB, 1, 4] the block's first 4 words
    xg = xd + z + ((s * 8) >> 3) + 0 * e  # (not contiguous in s to Triton: one layout)
    xh = xs + z + 2 * s + tl.minimum(e, 1)  # the block's two sums of 16
    for mi in tl.static_range(BLOCK_M):
        t = tl.minimum(mi, M - 1).to(tl.int64)  # rows past M recompute the last one
        x0, x1, x2, x3 = split4(load(xw + t * sq, m, MASK), BN, NB, 1)
        x4, x5, x6, x7 = split4(load(xw + t * sq + 4, m, MASK), BN, NB, 1)
        xd_t, _, _, _ = split4(load(xg + t * sd, m, MASK), BN, NB, 1)
        if TYPE == 8:
            dot = dp4a(w3, x3, dp4a(w2, x2, dp4a(w1, x1, dp4a(w0, x0, 0, True, ASM), True, ASM),
                                    True, ASM), True, ASM)
            dot = dp4a(w7, x7, dp4a(w6, x6, dp4a(w5, x5, dp4a(w4, x4, dot, True, ASM), True,
                                                 ASM), True, ASM), True, ASM)
            r = d * xd_t * dot.to(tl.float32)
        else:  # high nibbles in place (16x)
            lo = dp4a(w3 & 0x0F0F0F0F, x3, dp4a(w2 & 0x0F0F0F0F, x2, dp4a(
                w1 & 0x0F0F0F0F, x1, dp4a(w0 & 0x0F0F0F0F, x0, 0, False, ASM), False, ASM),
                False, ASM), False, ASM)
            hi = dp4a(w3 & HI4, x7, dp4a(w2 & HI4, x6, dp4a(w1 & HI4, x5, dp4a(
                w0 & HI4, x4, 0, False, ASM), False, ASM), False, ASM), False, ASM)
            s0, s1, _, _ = split4(load(xh + t * ss, m, MASK), BN, NB, 1)
            r = d * xd_t * (lo.to(tl.float32) + hi.to(tl.float32) * 0.0625) + off * (s0 + s1)
        if BLOCK_M == 1:
            acc += r
        else:
            r = tl.sum(tl.reshape(r, (BN, NB)), 1)
            acc += tl.where(tl.arange(0, BLOCK_M)[None, :] == mi, r[:, None], 0.0)
    return acc
