"""Q4_K / Q6_K matmul for 9 to a few hundred tokens, and dequantize: tiles decoded from words.

The GGUF GEMM of kernels/gguf_gemm.py decodes its tiles byte by byte (kernels/gguf_tiles.py,
~65 lane operations a weight); this one loads a super-block's quant bytes as 32-bit (Q4_K)
or 16-bit (Q6_K: 210-byte blocks are 2-byte aligned) words and shifts all nibbles out at
once into a tile whose flat order is K's own order, so the activations load as one
contiguous [BLOCK_M, KP] tile: about six operations a weight. The weights are the MMA's M
side and the tokens its N side (the "swap AB" of vLLM's small-M CUTLASS dispatch,
csrc/quantization/cutlass_w8a8/c3x/scaled_mm_sm90_fp8_dispatch.cuh), so a batch of 16
tokens still fills 64-row tensor-core tiles. Block layouts: llama.cpp ggml-common.h
(block_q4_K, block_q6_K) as engine/gguf/dequant.py reads them; the role is vLLM's GGUF
fused matmul for batches past the vector kernel (csrc/quantization/gguf/gguf_kernel.cu
ggml_mul_mat_a8, dispatched by _fused_mul_mat_gguf), with own code.

Weights are the raw GGUF bytes [N, row_bytes] uint8 as in kernels/gguf_gemm.py; kquant_mmq
checks their word alignment and that N, K and the block count agree with their own shape.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from libvllm.kernels._common import cdiv, check
from libvllm.kernels.ggml_types import GGMLType
from libvllm.kernels.launch_cache import cached_launch
from libvllm.kernels.launch_configs import GgufBlocksConfig, KquantMmqConfig

# type -> (bytes per super-block, bytes per word loaded)
KQUANT_MMQ_TYPES: dict[int, tuple[int, int]] = {GGMLType.Q4_K: (144, 4), GGMLType.Q6_K: (210, 2)}


@triton.jit
def _f16_bits(h):
    """fp32 of the fp16 whose bits are the low 16 of int32 tensor h."""
    return h.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _moved(word, at, to: tl.constexpr):
    """int32 `word` shifted so that its bit `at` lands on bit `to` (per element; the shift
    amounts are constants of each element's position, so this is one shift)."""
    return tl.where(at <= to, word << tl.maximum(to - at, 0), word >> tl.maximum(at - to, 0))


@triton.jit
def _q4_k_part(words, n_ok, PART: tl.constexpr):
    """Values 128 * PART .. + 127 of Q4_K super-blocks at int32 pointers `words` [BN]:
    block_q4_K is d | dmin (word 0), scales[12] (words 1-3), qs[128] (words 4-35). Chunk c
    of 32 qs bytes holds sub-block 2c in its low nibbles and 2c + 1 in its high ones, so
    nibble (h, byte) of qs word (c, w8) is value 64c + 32h + 4 w8 + byte: decoded as
    [BN, 2 c, 2 h, 8 w8, 4 byte], its flat order is K order -> [BN, 128] fp32."""
    m = n_ok[:, None]
    qs = tl.load(words[:, None] + 4 + 16 * PART + tl.arange(0, 16)[None, :], mask=m, other=0)
    w0 = tl.load(words, mask=n_ok, other=0)[:, None]  # d | dmin
    w1 = tl.load(words + 1, mask=n_ok, other=0)[:, None]  # scales bytes 0-3
    w2 = tl.load(words + 2, mask=n_ok, other=0)[:, None]  # 4-7
    w3 = tl.load(words + 3, mask=n_ok, other=0)[:, None]  # 8-11
    sh = 8 * tl.arange(0, 4)[None, :]  # byte b of a word: sub-block 4 * PART + b
    if PART == 0:  # get_scale_min_k4, j < 4
        sc = (w1 >> sh) & 63
        mn = (w2 >> sh) & 63
    else:  # j >= 4: low nibbles in bytes 8-11, high two bits on top of bytes 0-7
        sc = ((w3 >> sh) & 15) | (((w1 >> (sh + 6)) & 3) << 4)
        mn = ((w3 >> (sh + 4)) & 15) | (((w2 >> (sh + 6)) & 3) << 4)
    scale = _f16_bits(w0) * sc.to(tl.float32)  # [BN, 4]
    off = _f16_bits(w0 >> 16) * mn.to(tl.float32)
    bn: tl.constexpr = words.shape[0]
    q = tl.reshape(qs, (bn, 2, 1, 8, 1))
    shift = (4 * tl.arange(0, 2)[:, None] + 8 * tl.arange(0, 4)[None, :])[None, None, :, None, :]
    # the nibble as fp32's mantissa top of 1.0: 1 + q / 16, exact, in a shift and one
    # three-input logic op (no quarter-rate int-to-float)
    f = ((_moved(q, shift, 19) & 0x780000) | 0x3F800000).to(tl.float32, bitcast=True)
    s16 = tl.reshape(16.0 * scale, (bn, 2, 2, 1, 1))
    w = f * s16 - (s16 + tl.reshape(off, (bn, 2, 2, 1, 1)))  # (f - 1) * 16 * scale - off
    return tl.reshape(w, (bn, 128))


@triton.jit
def _q6_k_part(halves, n_ok, PART: tl.constexpr):
    """Values 64 * PART .. + 63 of Q6_K super-blocks at int16 pointers `halves` [BN]:
    block_q6_K is ql[128] | qh[64] | scales[16] int8 | d fp16 (halves 0-63, 64-95, 96-103,
    104). Value 32 g + l of half h2 (g = 2 bq + a, l = 2 hw + byte) has the low bits in
    nibble bq of ql[64 h2 + 32 a + l] and the high two in bits 2g of qh[32 h2 + l]; this
    part is (h2, bq) = divmod(PART, 2): [BN, 2 a, 2 hw // 8, 8 hw % 8, 2 byte] in K order,
    one int8 scale per 16 values -> [BN, 64] fp32."""
    H2: tl.constexpr = PART // 2
    BQ: tl.constexpr = PART % 2
    m = n_ok[:, None]
    bn: tl.constexpr = halves.shape[0]
    ql = tl.load(halves[:, None] + 32 * H2 + tl.arange(0, 32)[None, :], mask=m, other=0)
    qh = tl.load(halves[:, None] + 64 + 16 * H2 + tl.arange(0, 16)[None, :], mask=m, other=0)
    d = _f16_bits(tl.load(halves + 104, mask=n_ok, other=0).to(tl.int32))[:, None]
    sc_at = (halves + 96).to(tl.pointer_type(tl.int8))[:, None] + 8 * H2 + 4 * BQ
    sc = tl.load(sc_at + tl.arange(0, 4)[None, :], mask=m, other=0).to(tl.float32)  # [BN, 4]
    byte = 8 * tl.arange(0, 2)[None, None, None, None, :]
    a = tl.arange(0, 2)[None, :, None, None, None]
    lo = tl.reshape(ql.to(tl.int32), (bn, 2, 2, 8, 1))  # ql/qh halves sign-extended:
    hi = tl.reshape(qh.to(tl.int32), (bn, 1, 2, 8, 1))  # the masks drop bits 16+
    bits = (_moved(lo, 4 * BQ + byte, 17) & 0x1E0000) | (
        _moved(hi, 4 * BQ + 2 * a + byte, 21) & 0x600000)
    f = (bits | 0x3F800000).to(tl.float32, bitcast=True)  # 1 + q / 64, q = 6 bits [BN, 2, 2, 8, 2]
    s64 = tl.reshape(64.0 * d * sc, (bn, 2, 2, 1, 1))
    return tl.reshape(f * s64 - 1.5 * s64, (bn, 64))  # (q - 32) * scale


@triton.jit
def _kquant_rows(w_ptr, n, stride_w, TYPE: tl.constexpr):
    """Pointers [BN] to weight rows n of raw Q4_K (int32 words) / Q6_K (int16 halves) blocks;
    stride_w is in those words."""
    if TYPE == 12:
        rows = w_ptr.to(tl.pointer_type(tl.int32)) + n.to(tl.int64) * stride_w
    else:
        tl.static_assert(TYPE == 14, "Q4_K or Q6_K")
        rows = w_ptr.to(tl.pointer_type(tl.int16)) + n.to(tl.int64) * stride_w
    return rows


@triton.jit
def _kquant_part(rows, s, n_ok, TYPE: tl.constexpr, PART: tl.constexpr):
    """Part PART of super-block s of `rows` (_kquant_rows): [BN, 128] fp32 for Q4_K (parts
    0-1), [BN, 64] for Q6_K (parts 0-3), in K order."""
    if TYPE == 12:
        w = _q4_k_part(rows + s * 36, n_ok, PART)
    else:
        w = _q6_k_part(rows + s * 105, n_ok, PART)
    return w


@triton.jit(do_not_specialize=["M"])  # one variant for every M of a config
def _kquant_mmq_kernel(
    x_ptr, w_ptr, y_ptr, M, N, nblk, stride_xm: tl.int64, stride_w: tl.int64,  # w in words
    stride_ym: tl.int64, stride_ys: tl.int64,
    TYPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, DOT_PREC: tl.constexpr,
):
    # program (BLOCK_N weight rows, BLOCK_M tokens, split): acc [BN, BM] = W [BN, Ks] @
    # x[BM, Ks]^T over this split's super-blocks (splits fill the SMs where N / BN is
    # small: Llama-8B's o and down give 64 programs for 132 SMs); a split stores its
    # partial sums in plane program_id(2) of y (fp32 [splits, M, N], summed by the
    # caller). The N index varies fastest so programs running together share x in L2
    per = tl.cdiv(nblk, tl.num_programs(2))
    s0 = tl.program_id(2) * per
    s1 = tl.minimum(s0 + per, nblk)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    n_ok = n < N
    x_rows = x_ptr + offs_m.to(tl.int64)[None, :] * stride_xm
    m_ok = (offs_m < M)[None, :]
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    rows = _kquant_rows(w_ptr, n, stride_w, TYPE)  # [BN]
    PARTS: tl.constexpr = 2 if TYPE == 12 else 4
    KP: tl.constexpr = 256 // PARTS
    for s in range(s0, s1):
        for part in tl.static_range(PARTS):
            w = _kquant_part(rows, s, n_ok, TYPE, part)  # [BN, KP] fp32
            k = s * 256 + part * KP + tl.arange(0, KP)[:, None]
            xt = tl.load(x_rows + k, mask=m_ok, other=0.0)  # [KP, BM]
            acc = tl.dot(w.to(xt.dtype), xt, acc, input_precision=DOT_PREC)
    y = y_ptr + tl.program_id(2) * stride_ys + offs_m.to(tl.int64)[None, :] * stride_ym
    y += n[:, None]
    tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=n_ok[:, None] & m_ok)


@cached_launch
@triton.jit
def _kquant_dequantize_kernel(
    w_ptr, out_ptr, N, nblk, stride_w: tl.int64, stride_out: tl.int64,  # w in words
    TYPE: tl.constexpr, BLOCK_N: tl.constexpr, SB: tl.constexpr,
):
    # program (BLOCK_N weight rows, SB super-blocks): raw blocks -> out [N, 256 * nblk], the
    # tiles decoded as _kquant_mmq_kernel decodes them, stored in K order
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    out_rows = out_ptr + n.to(tl.int64)[:, None] * stride_out
    rows = _kquant_rows(w_ptr, n, stride_w, TYPE)  # [BN]
    PARTS: tl.constexpr = 2 if TYPE == 12 else 4
    KP: tl.constexpr = 256 // PARTS
    for i in tl.static_range(SB):
        s = tl.program_id(1) * SB + i
        ok = n < tl.where(s < nblk, N, 0)  # rows of a block past the row's end: none
        for part in tl.static_range(PARTS):
            w = _kquant_part(rows, s, ok, TYPE, part)  # [BN, KP] fp32
            k = s * 256 + part * KP + tl.arange(0, KP)
            tl.store(out_rows + k[None, :], w.to(out_ptr.dtype.element_ty), mask=ok[:, None])


def kquant_mmq_fits(qweight: torch.Tensor, qtype: int) -> bool:
    """Whether kquant_mmq can read these raw blocks: its types, and rows aligned to its
    words (true for whole tensors and their row slices, which start at a block edge)."""
    traits = KQUANT_MMQ_TYPES.get(qtype)
    return traits is not None and qweight.dim() == 2 and qweight.data_ptr() % traits[1] == 0 and (
        qweight.stride(0) % traits[1] == 0)


@functools.lru_cache(maxsize=1024)
def kquant_config(m: int, n: int) -> KquantMmqConfig:
    """kquant_mmq's launch for M tokens and N weight rows, by rule: 64 weight rows (one
    warpgroup's wgmma M side) on 4 warps, the tokens rounded up to 16, 32 or 64; grids of
    few programs split K (more loads in flight): block_m 64 splits K in 2 (4 stages) up to
    64 programs, else 3 stages up to 132 programs and 2 beyond; block_m 16 (32) splits K
    in 4 (4 stages) up to 512 (132) programs, else 2 (3) stages unsplit. Q4_K and Q6_K
    share it. Measured by `python3 examples/bench/gguf_gemm.py --sweep`."""
    block_m = 16 if m <= 16 else 32 if m <= 32 else 64
    programs = cdiv(n, 64) * cdiv(m, block_m)
    if block_m == 64:
        if programs <= 64:
            return KquantMmqConfig(64, 64, 4, 4, 2)
        return KquantMmqConfig(64, 64, 4, 3 if programs <= 132 else 2, 1)
    if programs <= (512 if block_m == 16 else 132):
        return KquantMmqConfig(64, block_m, 4, 4, 4)
    return KquantMmqConfig(64, block_m, 4, 2 if block_m == 16 else 3, 1)


def kquant_dequant_config(qtype: int) -> GgufBlocksConfig | None:
    """kquant_dequantize's launch where kernels/gguf_gemm.py gguf_dequantize takes it over
    the byte tiles: Q6_K, 4 rows and 4 super-blocks a program on one warp; None for the
    other types (Q4_K's word-load decode is no faster, so it keeps the byte tiles).
    Measured by `python3 examples/bench/gguf_gemm.py --dequant-sweep`."""
    return GgufBlocksConfig(4, 4, 1) if qtype == GGMLType.Q6_K else None


def kquant_mmq(x: torch.Tensor, qweight: torch.Tensor, qtype: int,
               config: KquantMmqConfig | None = None) -> torch.Tensor:
    """y [M, N] = x [M, K] @ dequant(qweight).T for Q4_K / Q6_K raw blocks [N, row_bytes];
    N and the block count come from qweight's own shape (CVE-2026-53923), x's float dtype
    and device are the caller's check (kernels/gguf_gemm.py gguf_gemm)."""
    check(kquant_mmq_fits(qweight, qtype),
          lambda: f"kquant_mmq needs Q4_K or Q6_K blocks aligned to their words, got type "
          f"{qtype} at address {qweight.data_ptr():#x}, row stride {qweight.stride(0)}")
    block_bytes = KQUANT_MMQ_TYPES[qtype][0]
    n, row_bytes = qweight.shape
    nblk = row_bytes // block_bytes
    check(qweight.dtype == torch.uint8 and row_bytes % block_bytes == 0 and qweight.stride(1) == 1
          and x.dim() == 2 and x.shape[1] == 256 * nblk and x.stride(1) == 1,
          lambda: f"kquant_mmq: x {tuple(x.shape)} and {tuple(qweight.shape)} {qweight.dtype} "
          f"rows of {block_bytes}-byte blocks do not match")
    m = x.shape[0]
    cfg = config or kquant_config(m, n)
    block_n, block_m, splits = cfg.block_n, cfg.block_m, max(1, min(cfg.split_k, nblk))
    if m == 0 or n == 0:
        return torch.empty(m, n, dtype=x.dtype, device=x.device)
    # partial sums [splits, M, N] fp32, added in a fixed order (no atomics: repeatable)
    part = (torch.empty(m, n, dtype=x.dtype, device=x.device) if splits == 1 else
            torch.empty(splits, m, n, dtype=torch.float32, device=x.device))
    _kquant_mmq_kernel[(cdiv(n, block_n), cdiv(m, block_m), splits)](
        x, qweight, part, m, n, nblk, x.stride(0), qweight.stride(0) // KQUANT_MMQ_TYPES[qtype][1],
        part.stride(-2), part.stride(0) if splits > 1 else 0, TYPE=qtype, BLOCK_N=block_n,
        BLOCK_M=block_m, DOT_PREC="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return part if splits == 1 else part.sum(0).to(x.dtype)


def kquant_dequantize(qweight: torch.Tensor, qtype: int, dtype: torch.dtype,
                      config: GgufBlocksConfig | None = None) -> torch.Tensor:
    """Q4_K / Q6_K raw blocks [N, row_bytes] -> dense [N, K] `dtype`, decoded from word loads
    as kquant_mmq decodes them (the dequantize of dequantize + cuBLAS, kernels/gguf_gemm.py).
    config None: kquant_dequant_config's, else 16 rows and one super-block a program on 2
    warps; the caller checks the blocks (gguf_dequantize) and kquant_mmq_fits."""
    n, row_bytes = qweight.shape
    nblk = row_bytes // KQUANT_MMQ_TYPES[qtype][0]
    out = torch.empty(n, 256 * nblk, dtype=dtype, device=qweight.device)
    if n == 0 or nblk == 0:
        return out
    cfg = config or kquant_dequant_config(qtype) or GgufBlocksConfig(16, 1, 2)
    block_n, sb, warps = cfg.block_n, cfg.blocks, cfg.num_warps
    _kquant_dequantize_kernel[(cdiv(n, block_n), cdiv(nblk, sb))](
        qweight, out, n, nblk, qweight.stride(0) // KQUANT_MMQ_TYPES[qtype][1], out.stride(0),
        TYPE=qtype, BLOCK_N=block_n, SB=sb, num_warps=warps,
    )
    return out
