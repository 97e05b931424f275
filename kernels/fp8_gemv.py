"""The one-row block-FP8 GEMV in Triton: c = (a_q * As) @ (B_q * Bs)^T for one token, the
batch-1 decode path of kernels/fp8_block_gemm.py w8a8_block_fp8_matmul (same inputs).

vLLM 0.33 runs every M through _w8a8_triton_block_scaled_mm
(vllm/model_executor/layers/quantization/utils/fp8_utils.py), whose 16-row MMA tile is
1/16 used at M = 1; this kernel is kernels/gemv.py's row-block GEMV on FP8 weights: a
program streams BN weight rows in BK-wide steps into a [BN, BK] fp32 accumulator,
reduced once at the end. BN divides block_n, so the program's rows share one row of
weight scales, and each step multiplies the activation by its two scales per column
(a_s[k // block_k] * Bs[row block, k // block_k]) before the product: one multiply per
weight element. Sums in another order than the GEMM's (per-element scaling instead of
per-block), both fp32.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from libvllm.kernels._common import cdiv, check, next_pow2, pdl_launch, pdl_wait
from libvllm.kernels.launch_cache import cached_launch
from libvllm.kernels.launch_configs import GemvConfig


@cached_launch
@triton.jit
def _w8a8_block_fp8_gemv_kernel(
    a_ptr, as_ptr, b_ptr, bs_ptr, c_ptr, N, K, group_n, group_k, stride_bs_n,
    EVEN_K: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, USE_PDL: tl.constexpr,
):
    # a [K] fp8, as [cdiv(K, group_k)], b [N, K] fp8, bs [cdiv(N, group_n), cdiv(K, group_k)]
    # (row stride stride_bs_n, columns contiguous) -> c [N]
    if USE_PDL:  # the kernel before wrote a and its scales
        pdl_wait()
    rn = tl.program_id(0) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    row_mask = rn[:, None] < N
    bs_row = bs_ptr + ((tl.program_id(0) * BN) // group_n).to(tl.int64) * stride_bs_n
    wp = b_ptr + rn[:, None].to(tl.int64) * K + rk[None, :]  # [BN, BK] pointers
    acc = tl.zeros((BN, BK), dtype=tl.float32)
    for k in range(0, K, BK):
        ks = (k + rk) // group_k  # [BK] scale column of each k
        if EVEN_K:
            w = tl.load(wp, mask=row_mask, other=0.0, eviction_policy="evict_first")
            x = tl.load(a_ptr + k + rk)
            s = tl.load(as_ptr + ks) * tl.load(bs_row + ks)
        else:
            k_mask = rk < K - k
            w = tl.load(wp, mask=row_mask & k_mask[None, :], other=0.0,
                        eviction_policy="evict_first")
            x = tl.load(a_ptr + k + rk, mask=k_mask, other=0.0)
            s = (tl.load(as_ptr + ks, mask=k_mask, other=0.0)
                 * tl.load(bs_row + ks, mask=k_mask, other=0.0))
        acc += w.to(tl.float32) * (x.to(tl.float32) * s)[None, :]
        wp += BK
    y = tl.sum(acc, axis=1)  # [BN] fp32
    tl.store(c_ptr + rn, y.to(c_ptr.dtype.element_ty), mask=rn < N)


@functools.lru_cache(maxsize=1024)
def fp8_gemv_config(n: int, k: int, block_n: int) -> GemvConfig:
    """The launch of an [n, k] fp8 weight in block_n-row scale blocks: kernels/gemv.py's
    bytes per step with rows twice as long (fp8): n >= k 4 rows of 2048-wide steps, n < k
    8 rows of 1024-wide steps (block_k capped at next_pow2(k)), halved until block_n
    divides the scale block; 4 warps, 2 stages. Measured by `python3
    examples/bench/fp8_gemm.py --peak-tflops P --m 1` (its fp8_gemv rows)."""
    bn = 4 if n >= k else 8
    while block_n % bn:
        bn //= 2
    return GemvConfig(bn, min(2048 if n >= k else 1024, next_pow2(k)), 4, 2)


def w8a8_block_fp8_gemv(A: torch.Tensor, B: torch.Tensor, As: torch.Tensor, Bs: torch.Tensor,
                        block_size: list[int], output_dtype: torch.dtype,
                        config: GemvConfig | None = None) -> torch.Tensor:
    """A [1, K] fp8 contiguous, B [N, K] fp8 contiguous, As [1, cdiv(K, bk)], Bs
    [cdiv(N, bn), cdiv(K, bk)] fp32 with contiguous rows -> C [1, N] output_dtype (the
    block GEMM launcher validated the rest). config: for sweeps; None: fp8_gemv_config's."""
    N, K = B.shape
    block_n, block_k = block_size
    cfg = config or fp8_gemv_config(N, K, block_n)
    bn, bk = cfg.block_n, cfg.block_k
    check(block_n % bn == 0, lambda: f"BN {bn} must divide block_n {block_n}")
    check(B.is_contiguous() and As.stride(-1) == 1 and Bs.stride(1) == 1,
          "B, and the scales' rows, must be contiguous")
    C = torch.empty((1, N), dtype=output_dtype, device=A.device)
    _w8a8_block_fp8_gemv_kernel[(cdiv(N, bn),)](
        A, As, B, Bs, C, N, K, block_n, block_k, Bs.stride(0),
        EVEN_K=K % bk == 0, BN=bn, BK=bk, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **pdl_launch(A),
    )
    return C
