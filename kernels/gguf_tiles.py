"""Triton device functions that decode one tile of raw GGUF (GGML) blocks.

Shared by kernels/gguf_gemm.py (dequantize, GEMV and GEMM kernels). The block layouts are
llama.cpp's ggml-common.h (block_q4_0 ... block_q6_K), read as engine/gguf/dequant.py does;
the per-type helpers mirror the dequantize functions of vllm-gguf-plugin
(vllm_gguf_plugin/triton/dequantize/*) with own code.

Every helper takes `rows` ([BN, 1, 1] byte pointers to the start of BN weight rows), the first
block index `blk0` of this step along K, the row's block count `nblk` and the row mask, and
returns (q [BN, P, W], scale [BN, P, 1], offset [BN, P, 1], k [P, W]), all fp32 but k:
the weights are w = scale * q + offset, and k is each column's index along K. Every tile row
(p) is W consecutive bytes (or values) sharing one scale, so a caller can reduce q * x over
the last axis inside a thread and apply the scale once per row. The GEMV uses W = 8 (8 bf16
activations are one 16-byte load laid out like the 8 weight bytes: no layout conversion);
dequantize and the fused GEMM use the widest W a type allows. A type's step is split into
PARTS (nibble halves, bit planes), each returned by one call. Small integers become floats
with the 2^23 trick (in the exponent bits, subtract 2^23): two full-rate ops instead of a
quarter-rate I2F.
"""

from __future__ import annotations

import triton
import triton.language as tl

# GGMLType ids (kernels/ggml_types.py) of the types these helpers decode.
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K = 2, 3, 6, 7, 8, 12, 13, 14


@triton.jit
def _f16_at(ptrs, mask):
    """The little-endian fp16 at byte pointers `ptrs` (2-byte aligned), as fp32."""
    return tl.load(ptrs.to(tl.pointer_type(tl.float16)), mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _small_to_f32(v):
    """Exact fp32 of integers 0 <= v < 2^23 (uint8/int32 tensors) without I2F."""
    return (v.to(tl.int32) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def _q8_0_tile(rows, blk0, nblk, n_mask, NB: tl.constexpr, W: tl.constexpr):
    # block_q8_0 (34 B): d fp16 | qs[32] int8; tile row p = (block p // R, W-wide piece e)
    R: tl.constexpr = 32 // W
    p = tl.arange(0, NB * R)[:, None]
    q = tl.arange(0, W)[None, :]
    b = blk0 + p // R
    e = p % R
    m = n_mask & (b < nblk)[None]
    base = rows + b * 34
    qs = tl.load(base + 2 + e * W + q, mask=m, other=0)  # uint8 bit patterns of int8
    v = _small_to_f32(qs ^ 0x80) - 128.0  # int8 value
    d = _f16_at(base, m)
    return v, d, d * 0.0, b * 32 + e * W + q


@triton.jit
def _legacy_tile(rows, blk0, nblk, n_mask, NB: tl.constexpr, PART: tl.constexpr,
                 W: tl.constexpr, SIZE: tl.constexpr, HAS_MIN: tl.constexpr,
                 HAS_QH: tl.constexpr):
    # block_q4_0 / q4_1 / q5_0 / q5_1: d fp16 | [m fp16] | [qh u32] | qs[16]; PART 0 = low
    # nibbles (values 0..15), PART 1 = high nibbles (16..31); tile row p = (block p // R,
    # W-byte piece e of the 16 bytes) -> [BN, NB * R, W]
    R: tl.constexpr = 16 // W
    p = tl.arange(0, NB * R)[:, None]
    q = tl.arange(0, W)[None, :]
    b = blk0 + p // R
    e = p % R
    m = n_mask & (b < nblk)[None]
    base = rows + b * SIZE
    qs_at: tl.constexpr = 2 + 2 * HAS_MIN + 4 * HAS_QH
    v = (tl.load(base + qs_at + e * W + q, mask=m, other=0) >> (4 * PART)) & 0x0F
    if HAS_QH:  # fifth bit of value j = bit j of the little-endian u32 qh: byte j // 8
        j = e * W + q
        qh = tl.load(base + 2 + 2 * HAS_MIN + 2 * PART + j // 8, mask=m, other=0)
        v = v | (((qh >> (j % 8)) & 1) << 4)
    d = _f16_at(base, m)
    if HAS_MIN:
        off = _f16_at(base + 2, m)
    else:
        off = d * (-16.0 if HAS_QH else -8.0)
    return _small_to_f32(v), d, off, b * 32 + PART * 16 + e * W + q


@triton.jit
def _k_scale_min(sp, j, m):
    """6-bit (scale, min) of sub-block j [P, 1] from the 12 bytes at sp (get_scale_min_k4)."""
    a = tl.load(sp + j, mask=m, other=0)  # j < 4: scale; j >= 4: high bits of the min
    b = tl.load(sp + j + 4, mask=m, other=0)  # j < 4: min; j >= 4: low nibbles of both
    c = tl.load(sp + tl.where(j >= 4, j - 4, j), mask=m, other=0)  # j >= 4: scale high bits
    sc = tl.where(j < 4, a & 63, (b & 15) | ((c >> 6) << 4))
    mn = tl.where(j < 4, b & 63, (b >> 4) | ((a >> 6) << 4))
    return _small_to_f32(sc), _small_to_f32(mn)


@triton.jit
def _kquant_tile(rows, blk0, nblk, n_mask, NB: tl.constexpr, PART: tl.constexpr,
                 W: tl.constexpr, HAS_QH: tl.constexpr):
    # block_q4_K (144 B): d | dmin | scales[12] | qs[128]; block_q5_K (176 B) adds qh[32]
    # before qs. Tile row p = (super-block, 32-byte chunk c, W-byte piece e); PART h takes
    # nibble h of the chunk = sub-block 2c + h -> [BN, NB * 4 * R, W]
    SIZE: tl.constexpr = 176 if HAS_QH else 144
    R: tl.constexpr = 32 // W
    p = tl.arange(0, NB * 4 * R)[:, None]
    q = tl.arange(0, W)[None, :]
    s = blk0 + p // (4 * R)
    c = (p % (4 * R)) // R
    e = p % R
    m = n_mask & (s < nblk)[None]
    base = rows + s * SIZE
    qs_at: tl.constexpr = 48 if HAS_QH else 16
    v = (tl.load(base + qs_at + c * 32 + e * W + q, mask=m, other=0) >> (4 * PART)) & 0x0F
    j = 2 * c + PART
    if HAS_QH:
        v = v | (((tl.load(base + 16 + e * W + q, mask=m, other=0) >> j) & 1) << 4)
    sc, mn = _k_scale_min(base + 4, j, m)
    scale = _f16_at(base, m) * sc
    return _small_to_f32(v), scale, -(_f16_at(base + 2, m) * mn), \
        s * 256 + c * 64 + PART * 32 + e * W + q


@triton.jit
def _q6_k_tile(rows, blk0, nblk, n_mask, NB: tl.constexpr, PART: tl.constexpr,
               W: tl.constexpr):
    # block_q6_K (210 B): ql[128] | qh[64] | scales[16] int8 | d fp16. Value v of a half h2
    # (128 values) is g * 32 + l (g = 2 * bq + a): low 4 bits = nibble bq of ql[h2 * 64 +
    # a * 32 + l], high 2 bits = bits 2g of qh[h2 * 32 + l]. PART = (a, bq); tile row p =
    # (super-block, h2, W-wide piece e of l), column = l % W -> [BN, NB * 2 * R, W], W <= 16
    a: tl.constexpr = PART % 2
    bq: tl.constexpr = PART // 2
    R: tl.constexpr = 32 // W
    p = tl.arange(0, NB * 2 * R)[:, None]
    q = tl.arange(0, W)[None, :]
    s = blk0 + p // (2 * R)
    h2 = (p % (2 * R)) // R
    e = p % R
    m = n_mask & (s < nblk)[None]
    base = rows + s * 210
    ql = tl.load(base + h2 * 64 + a * 32 + e * W + q, mask=m, other=0)
    qh = tl.load(base + 128 + h2 * 32 + e * W + q, mask=m, other=0)
    v = ((ql >> (4 * bq)) & 0x0F) | (((qh >> (2 * a + 4 * bq)) & 3) << 4)
    sc_ptr = base + 192 + h2 * 8 + 4 * bq + 2 * a + (e * W) // 16  # scale of values v // 16
    sc = tl.load(sc_ptr.to(tl.pointer_type(tl.int8)), mask=m, other=0).to(tl.float32)
    scale = _f16_at(base + 208, m) * sc
    return _small_to_f32(v), scale, scale * -32.0, \
        s * 256 + h2 * 128 + (2 * bq + a) * 32 + e * W + q


@triton.jit
def dequant_tile(TYPE: tl.constexpr, rows, blk0, nblk, n_mask, NB: tl.constexpr,
                 PART: tl.constexpr, W: tl.constexpr):
    """(q, scale, offset, k) of part PART of NB blocks from blk0, for GGML type TYPE."""
    if TYPE == 8:
        return _q8_0_tile(rows, blk0, nblk, n_mask, NB, W)
    elif TYPE == 2:
        return _legacy_tile(rows, blk0, nblk, n_mask, NB, PART, W, 18, False, False)
    elif TYPE == 3:
        return _legacy_tile(rows, blk0, nblk, n_mask, NB, PART, W, 20, True, False)
    elif TYPE == 6:
        return _legacy_tile(rows, blk0, nblk, n_mask, NB, PART, W, 22, False, True)
    elif TYPE == 7:
        return _legacy_tile(rows, blk0, nblk, n_mask, NB, PART, W, 24, True, True)
    elif TYPE == 12:
        return _kquant_tile(rows, blk0, nblk, n_mask, NB, PART, W, False)
    elif TYPE == 13:
        return _kquant_tile(rows, blk0, nblk, n_mask, NB, PART, W, True)
    else:
        tl.static_assert(TYPE == 14, "unsupported GGML type")
        return _q6_k_tile(rows, blk0, nblk, n_mask, NB, PART, W)


# type -> (values per block, parts per step, values per part and block, widest W); a tile is
# [BN, NB * values_per_part // W, W]
TILE_TYPES: dict[int, tuple[int, int, int, int]] = {
    Q4_0: (32, 2, 16, 16), Q4_1: (32, 2, 16, 16), Q5_0: (32, 2, 16, 16), Q5_1: (32, 2, 16, 16),
    Q8_0: (32, 1, 32, 32), Q4_K: (256, 2, 128, 32), Q5_K: (256, 2, 128, 32),
    Q6_K: (256, 4, 64, 16),
}
