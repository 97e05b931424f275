"""Decode GEMV and dequantize over repacked GGUF weights (kernels/gguf_repack.py layout).

The batch-1..8 decode path of a GGUF linear layer on CUDA (engine/layers/linear.py
GGUFWeight) for Q4_0, Q8_0, Q4_K, Q5_K and Q6_K: y [M, N] = x [M, K] @ W.T (+ bias). Each
program takes BLOCK_N output rows and BLOCK_G quads (4 words: a group of 32 4-bit values,
half a Q8_0 group) per step; a lane loads one quad of each of its BLOCK_N rows with one
16-byte load (consecutive lanes, consecutive words: a coalesced 512-byte row piece per warp
and load), decodes two values per mask (kernels/gguf_packed_tiles.py), and sums f * x
per quad before the quad's scale: per value and token under one integer op, one
fp16-to-fp32 conversion and one FMA (sm_90 code at BLOCK_N 4: ~4.5 instructions per
Q4_K value, 4.3 Q4_0, 5.2 Q8_0, 5.4 Q5_K, 6.4 Q6_K; 4.1 for Q4_K at BLOCK_N 8; against
~11 for kernels/gguf_gemm.py's GEMV). The M
rows of x are a tile axis: weights are read once for every row. With silu_and_mul the
input is a gated MLP's gate_up [M, 2K] and silu(gate) * up is formed as it is loaded, as
kernels/gemv.py does. More than GEMV_MAX_M rows: the weight is dequantized to x's dtype by
a Triton kernel over the same planes and multiplied by torch (cuBLAS), the choice by M of
vLLM's GGUF linear (vllm/model_executor/layers/quantization/gguf.py _fused_mul_mat_gguf:
mmvq for a few tokens, dequantize + matmul for many).

Safety (CVE-2026-53923): N and K come from the qs plane's own shape, every other plane is
checked against them, and row offsets are 64-bit.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from engine.errors import UnsupportedError
from engine.gguf.constants import GGMLType
from kernels._common import (
    cdiv,
    check,
    check_float,
    check_same_device,
    next_pow2,
    pdl_launch,
    pdl_wait,
)
from kernels.gguf_packed_tiles import packed_high, packed_pair, packed_scales, pair_exponent
from kernels.gguf_repack import PACKED_TYPES, PackedGGUF

GEMV_MAX_M = 8  # up to this many rows of x: the GEMV; beyond, dequantize + cuBLAS
DEQUANT_CONFIG = (8, 16, 4)  # BLOCK_N, BLOCK_G, warps
# GGML type -> (plane name -> (dtype, elements per group and row, or per 8 groups))
_PLANES = {
    2: {"qh": None, "d": None}, 8: {"qh": None, "d": None},
    12: {"qh": None, "d": (torch.int32, 8)}, 13: {"qh": (torch.int32, 1), "d": (torch.int32, 8)},
    14: {"qh": (torch.int16, 4), "d": (torch.int16, 8)},
}


@triton.jit
def _load_x(x_ptr, row, M, K, col, i, SILU_AND_MUL: tl.constexpr):
    """x [1, T, 4] fp32 of token `row` at columns col + i (silu(gate) * up with
    SILU_AND_MUL, each rounded to x's dtype as kernels/activation.py rounds)."""
    ptr = x_ptr + col[None, :, None] + i[None, None, :]
    mask = ((col < K) & (col * 0 + row < M))[None, :, None]
    x = tl.load(ptr, mask=mask, other=0.0)
    if SILU_AND_MUL:
        up = tl.load(ptr + K, mask=mask, other=0.0)
        gate = x.to(tl.float32)
        # fast division (div.full.f32, <= 2 ulp before the rounding to x's dtype): the
        # IEEE one costs ~10 instructions per activation, paid again by every program
        silu = tl.fdiv(gate, 1.0 + tl.exp(-gate), ieee_rounding=False).to(x.dtype)
        x = (silu.to(tl.float32) * up.to(tl.float32)).to(x.dtype)
    return x.to(tl.float32)


@triton.jit
def _quads(t, WPG: tl.constexpr):
    """Tile quad t (4 words: one group of 4-bit values, half a Q8_0 group) -> (its group,
    the K column of its word 0's slot 0)."""
    R: tl.constexpr = WPG // 4
    g = t // R
    return g, g * 32 + (t % R) * 4


@triton.jit
def _load_quads(TYPE: tl.constexpr, qs_ptr, qh_ptr, sc_ptr, d_ptr, rows, n, N, t, NT, NG,
                WPG: tl.constexpr):
    """Quads t [T] of rows n: words [BN, T, 4] int32, the high-bit tile and the scales
    (kernels/gguf_packed_tiles.py); quads >= NT read as zeros."""
    wl = tl.arange(0, 4)
    g, _ = _quads(t, WPG)
    m3 = (n < N)[:, None, None] & (t < NT)[None, :, None]  # [BN, T, 1]
    w = tl.load(qs_ptr + rows * (NT * 4) + (t * 4)[None, :, None] + wl[None, None, :],
                mask=m3, other=0, eviction_policy="evict_first")
    h = packed_high(TYPE, qh_ptr, rows, g, wl, m3, NG)
    d_lo, m_lo, d_hi, m_hi = packed_scales(TYPE, sc_ptr, d_ptr, rows, g, m3, NG)
    return w, h, d_lo, m_lo, d_hi, m_hi


@triton.jit
def _packed_gemv_kernel(
    x_ptr, qs_ptr, qh_ptr, sc_ptr, d_ptr, bias_ptr, y_ptr, M, N, NG,
    stride_xm: tl.int64, stride_ym: tl.int64,
    TYPE: tl.constexpr, WPG: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_M: tl.constexpr, HAS_BIAS: tl.constexpr,
    SILU_AND_MUL: tl.constexpr, PREFETCH: tl.constexpr, ASM: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    # program: rows n [BN] x all of K in steps of BLOCK_G quads of 4 words (a lane's
    # 16-byte load); every tile is [BN, T, 4] in that layout, so none changes layout inside
    # the loop. Token m's per-quad sums go to column m % 4 of acc_a (m < 4) or acc_b.
    NPAIR: tl.constexpr = 16 // WPG  # pairs per word: 4 (nibbles), 2 (bytes)
    E: tl.constexpr = 24 if TYPE == 8 else 20  # every f * x term is q * x * 2^-E
    SCALE: tl.constexpr = 2.0 ** E
    X0: tl.constexpr = 2.0 ** (pair_exponent(TYPE, 0) - E)  # pair 0's x factor
    NT = NG * (WPG // 4)  # quads per row
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = n.to(tl.int64)[:, None, None]  # [BN, 1, 1]
    wl = tl.arange(0, 4)
    K = NG * 32
    SPLIT: tl.constexpr = TYPE == 14  # the halves of a word have their own scales
    acc_1 = tl.zeros([BLOCK_N, BLOCK_G, 1], dtype=tl.float32)  # BLOCK_M 1
    acc_a = tl.zeros([BLOCK_N, BLOCK_G, 4], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK_N, BLOCK_G, 4], dtype=tl.float32)
    if PREFETCH:  # step i + 1's words and scales load while step i computes
        w_n, h_n, dl_n, ml_n, dh_n, mh_n = _load_quads(
            TYPE, qs_ptr, qh_ptr, sc_ptr, d_ptr, rows, n, N, tl.arange(0, BLOCK_G), NT, NG, WPG)
    if USE_PDL:  # the kernel before wrote x (the weights were written at load)
        pdl_wait()
    for t0 in range(0, NT, BLOCK_G):
        t = t0 + tl.arange(0, BLOCK_G)
        g, col = _quads(t, WPG)
        if PREFETCH:
            w, h, d_lo, m_lo, d_hi, m_hi = w_n, h_n, dl_n, ml_n, dh_n, mh_n
            w_n, h_n, dl_n, ml_n, dh_n, mh_n = _load_quads(
                TYPE, qs_ptr, qh_ptr, sc_ptr, d_ptr, rows, n, N, t + BLOCK_G, NT, NG, WPG)
        else:
            w, h, d_lo, m_lo, d_hi, m_hi = _load_quads(
                TYPE, qs_ptr, qh_ptr, sc_ptr, d_ptr, rows, n, N, t, NT, NG, WPG)
        for mi in tl.static_range(BLOCK_M):
            x_row = x_ptr + mi * stride_xm
            # pair 0 starts the sums (no zero fill): f = sum of f * x (x * 16 on the pairs
            # whose f is q * 2^-24, so every term is q * x * 2^-20; Q8_0 2^-24 throughout),
            # x = sum of x; one sum for both halves of a word unless their scales differ
            v_lo, v_hi = packed_pair(TYPE, w, h, 0, ASM)  # [BN, T, 4]
            x_lo = _load_x(x_row, mi, M, K, col, wl, SILU_AND_MUL)  # [1, T, 4]
            xh = _load_x(x_row, mi, M, K, col, WPG * NPAIR + wl, SILU_AND_MUL)
            f_lo = v_lo * (x_lo * X0)
            if SPLIT:
                f_hi = v_hi * (xh * X0)
                x_hi = xh
            else:
                f_lo += v_hi * (xh * X0)
                x_lo += xh
            for p in tl.static_range(1, NPAIR):
                v_lo, v_hi = packed_pair(TYPE, w, h, p, ASM)
                xl = _load_x(x_row, mi, M, K, col, WPG * p + wl, SILU_AND_MUL)
                xh = _load_x(x_row, mi, M, K, col, WPG * (p + NPAIR) + wl, SILU_AND_MUL)
                x_lo += xl
                if TYPE != 8 and p % 2 == 0:  # f = q * 2^-24: x * 16
                    xl = xl * 16.0
                    xh_s = xh * 16.0
                else:
                    xh_s = xh
                f_lo += v_lo * xl
                if SPLIT:
                    f_hi += v_hi * xh_s
                    x_hi += xh
                else:
                    f_lo += v_hi * xh_s
                    x_lo += xh
            # sum over a quad of (D q - M) x = 2^E D sum(f x) - M sum(x)
            c = (SCALE * d_lo) * tl.sum(f_lo, 2, keep_dims=True) - \
                m_lo * tl.sum(x_lo, 2, keep_dims=True)  # [BN, T, 1]
            if SPLIT:
                c += (SCALE * d_hi) * tl.sum(f_hi, 2, keep_dims=True) - \
                    m_hi * tl.sum(x_hi, 2, keep_dims=True)
            if BLOCK_M == 1:
                acc_1 += c
            elif mi < 4:
                acc_a += tl.where(wl[None, None, :] == mi, c, 0.0)
            else:
                acc_b += tl.where(wl[None, None, :] == mi - 4, c, 0.0)
    n2 = n[:, None]  # [BN, 1]
    if HAS_BIAS:
        bias = tl.load(bias_ptr + n2, mask=n2 < N, other=0.0).to(tl.float32)
    else:
        bias = tl.zeros([BLOCK_N, 1], dtype=tl.float32)
    if BLOCK_M == 1:
        y = tl.sum(acc_1, 1) + bias  # [BN, 1]
        tl.store(y_ptr + n2, y.to(y_ptr.dtype.element_ty), mask=(n2 < N) & (n2 * 0 < M))
    else:
        om = wl[None, :]  # [1, 4]: token of each acc column
        y = tl.sum(acc_a, 1) + bias  # [BN, 4]
        tl.store(y_ptr + om.to(tl.int64) * stride_ym + n2, y.to(y_ptr.dtype.element_ty),
                 mask=(n2 < N) & (om < M))
        if BLOCK_M > 4:
            y = tl.sum(acc_b, 1) + bias
            tl.store(y_ptr + (om + 4).to(tl.int64) * stride_ym + n2,
                     y.to(y_ptr.dtype.element_ty), mask=(n2 < N) & (om + 4 < M))


@triton.jit
def _packed_dequantize_kernel(
    qs_ptr, qh_ptr, sc_ptr, d_ptr, out_ptr, N, NG, stride_out: tl.int64,
    TYPE: tl.constexpr, WPG: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_G: tl.constexpr, ASM: tl.constexpr,
):
    # program (BLOCK_N rows, BLOCK_G quads): planes -> out [N, 32 NG], w = D q - M in the
    # engine's order (engine/gguf/dequant.py), so the values are the same floats
    NPAIR: tl.constexpr = 16 // WPG
    OFF: tl.constexpr = 8.0 if TYPE == 2 else (128.0 if TYPE == 8 else 32.0)  # Q4_0 Q8_0 Q6_K
    NT = NG * (WPG // 4)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    t = tl.program_id(1) * BLOCK_G + tl.arange(0, BLOCK_G)
    g, col = _quads(t, WPG)
    rows = n.to(tl.int64)[:, None, None]
    wl = tl.arange(0, 4)
    m3 = (n < N)[:, None, None] & (t < NT)[None, :, None]
    w = tl.load(qs_ptr + rows * (NT * 4) + (t * 4)[None, :, None] + wl[None, None, :],
                mask=m3, other=0)
    h = packed_high(TYPE, qh_ptr, rows, g, wl, m3, NG)
    d_lo, m_lo, d_hi, m_hi = packed_scales(TYPE, sc_ptr, d_ptr, rows, g, m3, NG)
    out = out_ptr + rows * stride_out + col[None, :, None] + wl[None, None, :]
    for p in tl.static_range(NPAIR):
        v_lo, v_hi = packed_pair(TYPE, w, h, p, ASM)
        q_lo = v_lo * 2.0 ** pair_exponent(TYPE, p)  # exact small integers
        q_hi = v_hi * 2.0 ** pair_exponent(TYPE, p)
        if TYPE == 12 or TYPE == 13:  # (d * sc) * q - dmin * m
            w_lo = d_lo * q_lo - m_lo
            w_hi = d_hi * q_hi - m_hi
        else:  # d * (q - offset), offset = M / D
            w_lo = d_lo * (q_lo - OFF)
            w_hi = d_hi * (q_hi - OFF)
        tl.store(out + WPG * p, w_lo.to(out_ptr.dtype.element_ty), mask=m3)
        tl.store(out + WPG * (p + NPAIR), w_hi.to(out_ptr.dtype.element_ty), mask=m3)


def _asm(t: torch.Tensor) -> bool:
    """Whether the kernels may use inline PTX: a CUDA tensor, not the interpreter."""
    return t.is_cuda and os.environ.get("TRITON_INTERPRET") != "1"


def check_packed(pw: PackedGGUF) -> tuple[int, int, int]:
    """Validate the planes against the qs plane's shape -> (N, K, groups per row)."""
    if pw.qtype not in PACKED_TYPES:
        raise UnsupportedError(f"packed GGUF kernels do not support type {pw.qtype}")
    wpg = PACKED_TYPES[pw.qtype]
    qs = pw.qs
    check(qs.dtype == torch.int32 and qs.dim() == 2 and qs.is_contiguous()
          and qs.shape[1] % (wpg * (8 if pw.qtype in (12, 13, 14) else 1)) == 0,
          lambda: f"qs must be a contiguous [N, groups * {wpg}] int32 plane of whole blocks, "
          f"got {tuple(qs.shape)} {qs.dtype}")
    n, ng = qs.shape[0], qs.shape[1] // wpg
    want = {"sc": (torch.int16, 1), **_PLANES[pw.qtype]}
    for name, spec in want.items():
        t = getattr(pw, name)
        if spec is None:
            if t is not None:
                check(False, f"{name} must be None for this type")
            continue
        dtype, per = spec
        cols = ng // 8 if name == "d" else ng * per
        if not (t is not None and t.dtype == dtype and tuple(t.shape) == (n, cols)
                and t.is_contiguous()):
            check(False, f"{name} must be a contiguous [{n}, {cols}] {dtype}, got "
                  f"{None if t is None else (tuple(t.shape), t.dtype)}")
        check_same_device(qs=qs, **{name: t})
    return n, ng * 32, ng


def gemv_packed_config(qtype: int, n: int, k: int, m: int,
                       silu_and_mul: bool = False) -> tuple[int, int, int, bool]:
    """(BLOCK_N, BLOCK_G, warps, prefetch): 2 warps whose lanes take one quad (16-byte
    load) each along K, 64 quads per step, BLOCK_N rows per lane (the activations loaded,
    and SiLU-and-mul computed, once for them), and the next step's words loaded while a
    step computes (Triton does not pipeline these loads). One token: 8 rows with the fused
    SiLU-and-mul or a tall 4/8-bit weight (N >= 16384: gate_up, an LM head), else 4 (o, qkv
    and down keep ~16 warps per SM); fewer rows as the token tile grows. Q5_K / Q6_K drop
    the prefetch where it would not fit in 255 registers. Chosen from the compiled sm_90
    code (no spills, no shared-memory layout change in the loop); the H200 sweep is
    examples/bench/kernels.py --only packed --sweep gguf."""
    bm = next_pow2(max(m, 1))
    high_bits = qtype in (GGMLType.Q5_K, GGMLType.Q6_K)
    if bm == 1:
        block_n = 8 if silu_and_mul or (n >= 16384 and not high_bits) else 4
        prefetch = not (high_bits and block_n == 8)
    else:
        block_n = max(1, 4 // max(1, bm // 2))
        prefetch = not (high_bits and silu_and_mul)
    block_g = min(64, next_pow2(max(k // 32 * PACKED_TYPES[qtype] // 4, 1)))
    return block_n, block_g, max(1, min(2, block_g // 32)), prefetch


def gguf_packed_gemv(x: torch.Tensor, pw: PackedGGUF, bias: torch.Tensor | None = None,
                     silu_and_mul: bool = False, out: torch.Tensor | None = None,
                     config: tuple[int, int, int, bool] | None = None) -> torch.Tensor:
    """y [M, N] = x [M, K] @ W.T (+ bias), M <= GEMV_MAX_M; x [M, 2K] with silu_and_mul.
    out: an [M, N] destination with unit column stride (e.g. a column slice of a wider
    output), else a new tensor in x's dtype. config: (BLOCK_N, BLOCK_G, warps, prefetch),
    for sweeps; None: gemv_packed_config's."""
    n, k, ng = check_packed(pw)
    check_float("x", x)
    kx = 2 * k if silu_and_mul else k
    check(x.dim() == 2 and x.shape[1] == kx and x.stride(1) == 1,
          lambda: f"x must be [num_tokens, {kx}] with a contiguous last dimension, "
          f"got {tuple(x.shape)}")
    m = x.shape[0]
    check(m <= GEMV_MAX_M, lambda: f"the GEMV takes at most {GEMV_MAX_M} rows, got {m}")
    check_same_device(x=x, qs=pw.qs)
    if bias is not None:
        check(bias.shape == (n,) and bias.is_contiguous(),
              lambda: f"bias must be a contiguous [{n}], got {tuple(bias.shape)}")
        check_same_device(x=x, bias=bias)
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    check(out.shape == (m, n) and out.stride(1) == 1,
          lambda: f"out must be [{m}, {n}] with unit column stride, got {tuple(out.shape)}")
    if m == 0 or n == 0:
        return out
    block_n, block_g, warps, prefetch = config or gemv_packed_config(pw.qtype, n, k, m,
                                                                      silu_and_mul)
    wpg = PACKED_TYPES[pw.qtype]
    _packed_gemv_kernel[(cdiv(n, block_n),)](
        x, pw.qs, pw.qh if pw.qh is not None else pw.qs, pw.sc,
        pw.d if pw.d is not None else pw.sc, bias if bias is not None else pw.sc, out,
        m, n, ng, x.stride(0), out.stride(0),
        TYPE=pw.qtype, WPG=wpg, BLOCK_N=block_n, BLOCK_G=block_g,
        BLOCK_M=next_pow2(max(m, 1)), HAS_BIAS=bias is not None, SILU_AND_MUL=silu_and_mul,
        PREFETCH=prefetch, ASM=_asm(x), num_warps=warps, **pdl_launch(x),
    )
    return out


def gguf_packed_dequantize(pw: PackedGGUF, dtype: torch.dtype = torch.float16,
                           config: tuple[int, int, int] | None = None) -> torch.Tensor:
    """Repacked planes -> dense [N, K] `dtype`, the floats engine/gguf/dequant.py gives."""
    n, k, ng = check_packed(pw)
    out = torch.empty(n, k, dtype=dtype, device=pw.qs.device)
    if n == 0 or k == 0:
        return out
    block_n, block_g, warps = config or DEQUANT_CONFIG
    wpg = PACKED_TYPES[pw.qtype]
    _packed_dequantize_kernel[(cdiv(n, block_n), cdiv(ng * wpg // 4, block_g))](
        pw.qs, pw.qh if pw.qh is not None else pw.qs, pw.sc,
        pw.d if pw.d is not None else pw.sc, out, n, ng, out.stride(0),
        TYPE=pw.qtype, WPG=wpg, BLOCK_N=block_n, BLOCK_G=block_g,
        ASM=_asm(out), num_warps=warps,
    )
    return out


def gguf_packed_linear(x: torch.Tensor, pw: PackedGGUF, bias: torch.Tensor | None = None,
                       out: torch.Tensor | None = None) -> torch.Tensor:
    """y [M, N] = x [M, K] @ W.T (+ bias), by M: the GEMV for M <= GEMV_MAX_M, else
    dequantize to x's dtype + torch matmul (cuBLAS)."""
    if x.dim() == 2 and x.shape[0] <= GEMV_MAX_M:
        return gguf_packed_gemv(x, pw, bias, out=out)
    n, k, _ = check_packed(pw)
    check_float("x", x)
    check(x.dim() == 2 and x.shape[1] == k, lambda: f"x must be [num_tokens, {k}], "
          f"got {tuple(x.shape)}")
    w = gguf_packed_dequantize(pw, x.dtype)
    y = torch.nn.functional.linear(x, w, bias)
    if out is None:
        return y
    out.copy_(y)
    return out
