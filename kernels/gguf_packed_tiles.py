"""Triton device helpers that decode the repacked GGUF planes (kernels/gguf_repack.py).

Shared by the decode GEMV and the dequantize kernel of kernels/gguf_packed.py. A tile is
[BN rows, T quads, 4 words] (a quad: a group of 32 4-bit values or half a Q8_0 group; `g`
below is each quad's group); pair p of a word is its slots p and p + S/2
(S slots per word), 16 bits apart, so one mask (LOP3; a shift by 8 per word for the upper
slots) leaves both values' bits in the mantissas of an fp16 pair with a zero exponent: two
fp16 subnormals f = q * 2^-24 (or 2^-20), exact, converted to fp32 by one cvt each. The GEMV
sums f * x per quad and applies w = D q - M once per quad: sum = 2^E D sum(f x) - M sum(x),
about 0.6-1.6 integer ops per value instead of a shift, mask and int-to-float per value.
Type ids are GGMLType's (engine/gguf/constants.py): Q4_0 2, Q8_0 8, Q4_K 12, Q5_K 13, Q6_K 14.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _shift(v, s: tl.constexpr):
    """v << s for s >= 0, arithmetic v >> -s otherwise (int32)."""
    if s >= 0:
        return v << s
    else:
        return v >> (-s)


@triton.jit
def _fp16_bits_to_f32(v):
    """The fp16 in the low 16 bits of int32 v, as fp32."""
    return v.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _halves_to_f32(bits, ASM: tl.constexpr):
    """(low, high) fp16 halves of int32 `bits` as two fp32 tensors. ASM (a GPU): one
    cvt.f32.f16 per half straight from the 32-bit register (the generic lowering first
    repacks the halves with a PRMT each); the interpreter runs the plain ops."""
    if ASM:
        return tl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.f32.f16 $0, lo; "
            "cvt.f32.f16 $1, hi; }", "=r,=r,r", [bits], dtype=(tl.float32, tl.float32),
            is_pure=True, pack=1)
    else:
        return _fp16_bits_to_f32(bits), _fp16_bits_to_f32(bits >> 16)


@triton.jit
def pair_exponent(TYPE: tl.constexpr, P: tl.constexpr):
    """E with packed_pair's f = q * 2^-E: 20 for the odd pairs of 4/5/6-bit words (the
    value sits 4 bits up), else 24."""
    return 20 if (TYPE != 8 and P % 2 == 1) else 24


@triton.jit
def packed_pair(TYPE: tl.constexpr, w, h, P: tl.constexpr, ASM: tl.constexpr):
    """(f_lo, f_hi) fp32 [BN, T, 4] of pair P: slots P and P + S/2 of words w as fp16
    subnormals, f = q * 2^-pair_exponent (exact), with the high-bit tile h (Q5_K: the
    group's qh word shifted right by the word index; Q6_K: the word's 16-bit qh | qh << 8;
    else unused). Pairs 0, 1 read w, pairs 2, 3 w >> 8 (bytes: pair 1); even pairs take
    bits 0.. of each half, odd ones bits 4..: one shift per word, one mask per pair."""
    if TYPE == 8:  # bytes s and s + 2 of w >> 8s
        bits = _shift(w, -8 * P) & 0x00FF00FF
    else:
        src = _shift(w, -8 * (P // 2))
        if P % 2 == 0:  # nibble at bits 0..3 of each half, high bits from bit 4
            if TYPE == 13:  # fifth bit of slot P at bit 4P of h
                bits = (src & 0x000F000F) | (_shift(h, 4 - 4 * P) & 0x00100010)
            elif TYPE == 14:  # top two bits of slot P at bits 2P of h
                bits = (src & 0x000F000F) | (_shift(h, 4 - 2 * P) & 0x00300030)
            else:
                bits = src & 0x000F000F
        else:  # nibble at bits 4..7, high bits from bit 8
            if TYPE == 13:
                bits = (src & 0x00F000F0) | (_shift(h, 8 - 4 * P) & 0x01000100)
            elif TYPE == 14:
                bits = (src & 0x00F000F0) | (_shift(h, 8 - 2 * P) & 0x03000300)
            else:
                bits = src & 0x00F000F0
    return _halves_to_f32(bits, ASM)


@triton.jit
def packed_high(TYPE: tl.constexpr, qh_ptr, rows, g, wl, mask, NG):
    """The high-bit tile packed_pair takes: [BN, T, 4] int32 (zeros for 4/8-bit types)."""
    if TYPE == 13:  # int32 [N, G]: one word per group, shifted by the word index
        g = tl.where(g < NG, g, 0)  # unknown contiguity: one group per lane, as the words
        h = tl.load(qh_ptr + rows * NG + g[None, :, None], mask=mask, other=0)
        return h >> wl[None, None, :]
    elif TYPE == 14:  # int16 [N, G * 4]: one half-word per word
        h = tl.load((qh_ptr + rows * (NG * 4) + (g * 4)[None, :, None] + wl[None, None, :])
                    .to(tl.pointer_type(tl.uint16)), mask=mask, other=0).to(tl.int32)
        return h | (h << 8)
    else:
        return wl[None, None, :] * 0


@triton.jit
def packed_scales(TYPE: tl.constexpr, sc_ptr, d_ptr, rows, g, mask, NG):
    """Per (row, quad) fp32 [BN, T, 1] (D_lo, M_lo, D_hi, M_hi): w = D * q - M for the
    values of slots < S/2 (lo) and >= S/2 (hi) of the group, as engine/gguf/dequant.py
    forms them. rows: [BN, 1, 1] int64 row indices; g: [T] groups; mask: [BN, T, 1]."""
    g = tl.where(g < NG, g, 0)  # unknown contiguity: one group per lane, as the words
    sc = tl.load(sc_ptr + rows * NG + g[None, :, None], mask=mask, other=0).to(tl.int32)
    if TYPE == 2:  # d bits; q - 8
        d = _fp16_bits_to_f32(sc)
        return d, 8.0 * d, d, 8.0 * d
    elif TYPE == 8:  # d bits; stored u = q + 128
        d = _fp16_bits_to_f32(sc)
        return d, 128.0 * d, d, 128.0 * d
    elif TYPE == 14:  # two int8 scales x d; q - 32
        d = _fp16_bits_to_f32(tl.load(d_ptr + rows * (NG // 8) + (g // 8)[None, :, None], mask=mask,
                                      other=0).to(tl.int32))
        d_lo = d * ((sc << 24) >> 24).to(tl.float32)
        d_hi = d * (sc >> 8).to(tl.float32)
        return d_lo, 32.0 * d_lo, d_hi, 32.0 * d_hi
    else:  # Q4_K / Q5_K: d * scale, dmin * min
        dd = tl.load(d_ptr + rows * (NG // 8) + (g // 8)[None, :, None], mask=mask, other=0)
        dl = _fp16_bits_to_f32(dd) * (sc & 63).to(tl.float32)
        ml = _fp16_bits_to_f32(dd >> 16) * ((sc >> 8) & 63).to(tl.float32)
        return dl, ml, dl, ml
