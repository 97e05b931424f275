"""GEMV / GEMM over raw GGUF blocks in Triton: quantized weights stay quantized on the GPU.

Mirrors vllm-gguf-plugin's dispatch (vllm_gguf_plugin/quantization/linear.py
_fused_mul_mat_gguf: a vector kernel for a few tokens, a fused dequantizing matmul for more,
dequantize + dense matmul beyond) and its Triton kernels (triton/gemm/*, triton/dequantize/*),
with own code. Weights are the GGUF tensor bytes viewed as [N, row_bytes] uint8 (one output
feature per row, row = K / block_size blocks of the type); the tiles are decoded by
kernels/gguf_tiles.py. Types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K.

Safety (CVE-2026-53923, GGUF dequant dimension truncation): N, K and the block count are
derived from the weight tensor's own shape, never from a declared dimension, and row offsets
are 64-bit, so no launch can address outside the tensor.

Block sizes come from kernels/ggml_types.py (re-exported by engine/gguf/constants.py); an
unsupported type raises UnsupportedError (kernels/errors.py, VLLM_ERR_UNSUPPORTED). The
reference is the engine's torch dequantize (engine/gguf/dequant.py), called by the tests.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from libvllm.kernels._common import cdiv, check, check_float, check_same_device, next_pow2
from libvllm.kernels.errors import UnsupportedError
from libvllm.kernels.ggml_types import GGML_TYPE_TRAITS, GGMLType
from libvllm.kernels.gguf_kquant_mmq import (
    kquant_dequant_config,
    kquant_dequantize,
    kquant_mmq,
    kquant_mmq_fits,
)
from libvllm.kernels.gguf_tiles import TILE_TYPES, dequant_tile
from libvllm.kernels.launch_cache import cached_launch
from libvllm.kernels.launch_configs import GgufBlocksConfig, GgufMmqConfig

# Dispatch by token count M: GEMV up to GEMV_MAX_M tokens, the fused GEMM up to MMQ_MAX_M
# (Q4_K / Q6_K: the word-load GEMM of kernels/gguf_kquant_mmq.py up to KQUANT_MAX_M, the
# largest M where it beats dequantize + cuBLAS summed over a Llama-3.1-8B layer's four
# linears), dequantize + cuBLAS beyond. Measured by `python3 examples/bench/gguf_gemm.py
# --m 9 16 32 64 128`.
GEMV_MAX_M = 4
MMQ_MAX_M = 16
KQUANT_MAX_M = {GGMLType.Q4_K: 64, GGMLType.Q6_K: 32}
# gguf_mmq's tile: 16 tokens x 64 rows, 4 warps, 2 stages (`python3
# examples/bench/gguf_gemm.py --sweep`)
GGUF_MMQ_CONFIG = GgufMmqConfig(block_m=16, block_n=64, num_warps=4, num_stages=2)


@functools.lru_cache(maxsize=256)
def gguf_gemv_config(qtype: int, n: int) -> GgufBlocksConfig:
    """gguf_gemv's launch for n outputs, by rule: one warp whose 32 lanes span a step of 32
    tile rows of 8 values, each lane holding block_n rows (an activation is loaded once a
    lane and reused block_n times): K-quants 4 rows and 64-value tile rows (Q6_K: 32),
    Q8_0 with more than 4096 outputs 4 rows and 64-value tile rows, other types one row
    and 32. Measured by `python3 examples/bench/kernels.py --only gguf --sweep gguf`."""
    nb = 256 // TILE_TYPES[qtype][2]  # blocks per 32 tile rows
    if TILE_TYPES[qtype][0] == 256:  # K-quants: 4 rows per lane
        return GgufBlocksConfig(4, nb * (2 if qtype != GGMLType.Q6_K else 1), 1)
    if qtype == GGMLType.Q8_0 and n > 4096:
        return GgufBlocksConfig(4, nb * 2, 1)
    return GgufBlocksConfig(1, nb, 1)


def gguf_dequant_config(qtype: int) -> GgufBlocksConfig:
    """The byte-tile dequantize's launch: 8 rows a program on one warp, 8 blocks a step
    for the 32-value types, one super-block for the K-quants."""
    return GgufBlocksConfig(8, 8 if TILE_TYPES[qtype][0] == 32 else 1, 1)


@cached_launch
@triton.jit
def _gguf_dequantize_kernel(
    w_ptr, out_ptr, N, K, nblk, stride_w: tl.int64, stride_out: tl.int64,
    TYPE: tl.constexpr, BLOCK_N: tl.constexpr, NB: tl.constexpr, PARTS: tl.constexpr,
    W: tl.constexpr,
):
    # program (BLOCK_N rows, NB blocks): raw [N, row_bytes] -> out [N, K]
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = (n < N)[:, None, None]
    rows = w_ptr + n.to(tl.int64)[:, None, None] * stride_w
    out_rows = out_ptr + n.to(tl.int64)[:, None, None] * stride_out
    for part in tl.static_range(PARTS):
        q, scale, off, k = dequant_tile(TYPE, rows, tl.program_id(1) * NB, nblk, n_mask, NB,
                                        part, W)
        tl.store(out_rows + k[None], (q * scale + off).to(out_ptr.dtype.element_ty),
                 mask=n_mask & (k < K)[None])


@cached_launch
@triton.jit
def _gguf_gemv_kernel(
    x_ptr, w_ptr, y_ptr, M, N, K, nblk, stride_xm: tl.int64, stride_w: tl.int64,
    stride_ym: tl.int64,
    TYPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, NB: tl.constexpr,
    PARTS: tl.constexpr, P: tl.constexpr,
):
    # program (BLOCK_N outputs, BLOCK_M tokens): y[m, n] = sum_k x[m, k] * w[n, k] in fp32.
    # Each 8-column tile row shares one scale: sum q * x over it inside a thread, then
    # apply scale and offset once (offset * sum x); rows are summed once at the end.
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m0 = tl.program_id(1) * BLOCK_M
    n_mask = (n < N)[:, None, None]
    rows = w_ptr + n.to(tl.int64)[:, None, None] * stride_w
    om = tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_N, P, BLOCK_M], dtype=tl.float32)
    for blk0 in range(0, nblk, NB):
        for part in tl.static_range(PARTS):
            q, scale, off, k = dequant_tile(TYPE, rows, blk0, nblk, n_mask, NB, part, 8)
            for mi in tl.static_range(BLOCK_M):
                x = tl.load(x_ptr + (m0 + mi) * stride_xm + k[None],
                            mask=k[None] < tl.where(m0 + mi < M, K, 0),
                            other=0.0).to(tl.float32)  # [1, P, 8]
                c = scale * tl.sum(q * x, 2, keep_dims=True) + off * tl.sum(x, 2,
                                                                            keep_dims=True)
                if BLOCK_M == 1:
                    acc += c
                else:
                    acc += tl.where(om[None, None, :] == mi, c, 0.0)
    out = tl.sum(acc, 1)  # [BN, BLOCK_M]
    y = y_ptr + (m0 + om).to(tl.int64)[None, :] * stride_ym + n[:, None]
    tl.store(y, out.to(y_ptr.dtype.element_ty), mask=(n < N)[:, None] & (m0 + om < M)[None, :])


@cached_launch
@triton.jit
def _gguf_mmq_kernel(
    x_ptr, w_ptr, y_ptr, M, N, K, nblk, stride_xm: tl.int64, stride_w: tl.int64,
    stride_ym: tl.int64,
    TYPE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NB: tl.constexpr,
    PARTS: tl.constexpr, W: tl.constexpr, DOT_PREC: tl.constexpr,
):
    # program (BLOCK_M tokens, BLOCK_N outputs): dequantized weight tiles fed to tl.dot;
    # the M index varies fastest so programs running together share weight tiles in L2
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = (n < N)[:, None, None]
    rows = w_ptr + n.to(tl.int64)[:, None, None] * stride_w
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None, None] * stride_xm
    m_mask = (offs_m < M)[:, None, None]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for blk0 in range(0, nblk, NB):
        for part in tl.static_range(PARTS):
            q, scale, off, k = dequant_tile(TYPE, rows, blk0, nblk, n_mask, NB, part, W)
            x = tl.load(x_rows + k[None], mask=m_mask & (k < K)[None], other=0.0)  # [BM, P, W]
            w = q * scale + off  # [BN, P, W]
            w2 = tl.reshape(w, (BLOCK_N, w.shape[1] * W)).to(x.dtype)
            x2 = tl.reshape(x, (BLOCK_M, w.shape[1] * W))
            acc = tl.dot(x2, tl.trans(w2), acc, input_precision=DOT_PREC)
    y = y_ptr + offs_m.to(tl.int64)[:, None] * stride_ym + n[None, :]
    tl.store(y, acc.to(y_ptr.dtype.element_ty),
             mask=(offs_m < M)[:, None] & (n < N)[None, :])


def _type_name(qtype: int) -> str:
    try:
        return GGMLType(qtype).name
    except ValueError:
        return f"#{qtype}"


def _check_weight(qweight: torch.Tensor, qtype: int) -> tuple[int, int, int]:
    """Validate raw blocks [N, row_bytes] uint8 -> (N, K, blocks per row)."""
    if qtype not in TILE_TYPES:
        raise UnsupportedError(f"GGUF Triton kernels do not support type {_type_name(qtype)}")
    block, type_size = GGML_TYPE_TRAITS[GGMLType(qtype)]
    check(qweight.dtype == torch.uint8 and qweight.dim() == 2 and qweight.stride(1) == 1,
          lambda: f"qweight must be [N, row_bytes] uint8 with contiguous rows, got "
          f"{tuple(qweight.shape)} {qweight.dtype}")
    n, row_bytes = qweight.shape
    check(row_bytes % type_size == 0,
          lambda: f"{_type_name(qtype)}: row of {row_bytes} bytes is not "
          f"a whole number of {type_size}-byte blocks")
    check(qweight.stride(0) % 2 == 0 and qweight.data_ptr() % 2 == 0,
          "qweight rows must be 2-byte aligned (fp16 block scales)")
    nblk = row_bytes // type_size
    return n, nblk * block, nblk


def _check_x(x: torch.Tensor, qweight: torch.Tensor, k: int) -> None:
    check_float("x", x)
    check(x.dim() == 2 and x.shape[1] == k and x.stride(1) == 1,
          lambda: f"x must be [num_tokens, {k}] with a contiguous last dimension, "
          f"got {tuple(x.shape)}")
    check_same_device(x=x, qweight=qweight)


def gguf_dequantize(
    qweight: torch.Tensor, qtype: int, dtype: torch.dtype = torch.float16,
    config: GgufBlocksConfig | None = None,
) -> torch.Tensor:
    """Raw blocks [N, row_bytes] uint8 -> dense [N, K] `dtype` (without a config, the types
    kquant_dequant_config names, word-aligned: kernels/gguf_kquant_mmq.py's word-load
    decode)."""
    n, k, nblk = _check_weight(qweight, qtype)
    if (config is None and kquant_dequant_config(qtype) is not None
            and kquant_mmq_fits(qweight, qtype)):
        return kquant_dequantize(qweight, qtype, dtype)
    out = torch.empty(n, k, dtype=dtype, device=qweight.device)
    if n == 0 or k == 0:
        return out
    cfg = config or gguf_dequant_config(qtype)
    block_n, nb, warps = cfg.block_n, cfg.blocks, cfg.num_warps
    _gguf_dequantize_kernel[(cdiv(n, block_n), cdiv(nblk, nb))](
        qweight, out, n, k, nblk, qweight.stride(0), out.stride(0), TYPE=qtype,
        BLOCK_N=block_n, NB=nb, PARTS=TILE_TYPES[qtype][1], W=TILE_TYPES[qtype][3],
        num_warps=warps,
    )
    return out


def gguf_gemv(x: torch.Tensor, qweight: torch.Tensor, qtype: int,
              config: GgufBlocksConfig | None = None, block_m: int = 1) -> torch.Tensor:
    """y [M, N] = x [M, K] @ W.T with fp32 FMA reductions: the path for a few tokens."""
    n, k, nblk = _check_weight(qweight, qtype)
    _check_x(x, qweight, k)
    m = x.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y
    cfg = config or gguf_gemv_config(qtype, n)
    block_n, nb, warps = cfg.block_n, cfg.blocks, cfg.num_warps
    _gguf_gemv_kernel[(cdiv(n, block_n), cdiv(m, block_m))](
        x, qweight, y, m, n, k, nblk, x.stride(0), qweight.stride(0), y.stride(0), TYPE=qtype,
        BLOCK_N=block_n, BLOCK_M=block_m, NB=nb, PARTS=TILE_TYPES[qtype][1],
        P=nb * TILE_TYPES[qtype][2] // 8, num_warps=warps,
    )
    return y


def gguf_mmq(x: torch.Tensor, qweight: torch.Tensor, qtype: int,
             config: GgufMmqConfig | None = None) -> torch.Tensor:
    """y [M, N] = x [M, K] @ W.T with tensor-core dots over dequantized tiles."""
    n, k, nblk = _check_weight(qweight, qtype)
    _check_x(x, qweight, k)
    m = x.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y
    cfg = config or GGUF_MMQ_CONFIG
    block_m, block_n = cfg.block_m, cfg.block_n
    # blocks per step: 64 values of K per dot for every type
    nb = {32: 4 if TILE_TYPES[qtype][1] == 2 else 2, 256: 1}[TILE_TYPES[qtype][0]]
    _gguf_mmq_kernel[(cdiv(m, block_m), cdiv(n, block_n))](
        x, qweight, y, m, n, k, nblk, x.stride(0), qweight.stride(0), y.stride(0), TYPE=qtype,
        BLOCK_M=block_m, BLOCK_N=block_n, NB=nb, PARTS=TILE_TYPES[qtype][1],
        W=TILE_TYPES[qtype][3], DOT_PREC="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return y


def gguf_gemm(x: torch.Tensor, qweight: torch.Tensor, qtype: int) -> torch.Tensor:
    """y [M, N] = x [M, K] @ dequant(qweight).T, choosing the path by M (as vLLM's GGUF
    linear does): GEMV for <= GEMV_MAX_M tokens, the fused GEMMs up to MMQ_MAX_M /
    KQUANT_MAX_M, beyond that dequantize to x's dtype and use torch's dense matmul (cuBLAS)."""
    m = x.shape[0] if x.dim() == 2 else -1
    if 0 <= m <= GEMV_MAX_M:
        return gguf_gemv(x, qweight, qtype, block_m=next_pow2(max(m, 1)))
    _check_x(x, qweight, _check_weight(qweight, qtype)[1])
    if m <= KQUANT_MAX_M.get(qtype, 0) and kquant_mmq_fits(qweight, qtype):
        return kquant_mmq(x, qweight, qtype)
    if m <= MMQ_MAX_M:
        return gguf_mmq(x, qweight, qtype)
    return x @ gguf_dequantize(qweight, qtype, x.dtype).T

