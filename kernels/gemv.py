"""Dense one-row GEMV in Triton: y = x @ w.T (+ bias) for x [1, K], w [N, K], fp32 accumulation.

The batch-1 decode path of the dense linear layers and the LM head (engine/layers/linear.py
dense_linear): at M = 1 cuBLAS runs a GEMV (plus a split-K reduce kernel for some shapes);
this plain row-block kernel is taken where it is faster (`python3 examples/bench/kernels.py
--only dense` times both on the device it runs on). Mirrors vLLM's one-token dense GEMV on ROCm
(vllm/model_executor/layers/utils.py rocm_unquantized_gemm -> ops.LLMM1,
csrc/rocm/skinny_gemms.cu): each program streams a few whole weight rows against the one
activation row, no split K; here BN rows in BK-wide steps into a [BN, BK] fp32
accumulator reduced once at the end. Rounding follows F.linear in fp32 rounded once to x's
dtype (the bias is added in fp32 before that rounding). With silu_and_mul, w is a gated
MLP's merged gate_up weight [2N, K] (gate rows, then up rows: MergedColumnParallelLinear's
layout on every rank) and a program accumulates BN gate rows beside their BN up rows, then
stores silu(gate) * up [N]: each product rounded to the dtype as F.linear's output, then
SiLU-and-mul rounded as kernels/activation.py rounds (fused_moe's silu_and_mul does the
same for the experts). The down projection of batch-1 decode then reads a plain [1, N]
row (computing SiLU-and-mul in its prologue instead would make every one of its ~1,000
programs read the [1, 2N] row and redo the exps). The weights are not prefetched before the
PDL wait: peeling the first tile breaks Triton's pipelining of the loop. Launch configs:
dense_gemv_config (kernels/launch_configs.py GemvConfig).
"""

from __future__ import annotations

import functools

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
from libvllm.kernels.activation import silu_and_mul_ref
from libvllm.kernels.launch_cache import cached_launch
from libvllm.kernels.launch_configs import GemvConfig


@cached_launch
@triton.jit
def _dense_gemv_kernel(
    x_ptr, w_ptr, bias_ptr, y_ptr, N, K,
    HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, SILU_AND_MUL: tl.constexpr,
    BN: tl.constexpr, BK: tl.constexpr, USE_PDL: tl.constexpr,
):
    if USE_PDL:  # the kernel before wrote this one's inputs
        pdl_wait()
    # one program: BN output values; x: [K], w rows: [BN, K] (row stride K; with
    # SILU_AND_MUL also the up rows [BN, K], N rows further), y: [BN]
    rn = tl.program_id(0) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    row_mask = rn[:, None] < N
    acc = tl.zeros((BN, BK), dtype=tl.float32)
    acc_up = tl.zeros((BN, BK), dtype=tl.float32)  # SILU_AND_MUL only
    wp = w_ptr + rn[:, None].to(tl.int64) * K + rk[None, :]  # [BN, BK] pointers
    up_offset = tl.cast(N, tl.int64) * K  # gate row i -> up row N + i (N may be a constexpr 1)
    xp = x_ptr + rk
    for k in range(0, K, BK):
        if EVEN_K:
            w = tl.load(wp, mask=row_mask, other=0.0, eviction_policy="evict_first")
            x = tl.load(xp)
            if SILU_AND_MUL:
                w_up = tl.load(wp + up_offset, mask=row_mask, other=0.0,
                               eviction_policy="evict_first")
        else:
            k_mask = rk < K - k
            w = tl.load(wp, mask=row_mask & k_mask[None, :], other=0.0,
                        eviction_policy="evict_first")
            x = tl.load(xp, mask=k_mask, other=0.0)
            if SILU_AND_MUL:
                w_up = tl.load(wp + up_offset, mask=row_mask & k_mask[None, :], other=0.0,
                               eviction_policy="evict_first")
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
        if SILU_AND_MUL:
            acc_up += w_up.to(tl.float32) * x.to(tl.float32)[None, :]
        wp += BK
        xp += BK
    y = tl.sum(acc, axis=1)  # [BN] fp32
    if HAS_BIAS:
        y += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)
    if SILU_AND_MUL:  # y = silu(gate) * up, each rounded to the output dtype
        up = tl.sum(acc_up, axis=1)
        if HAS_BIAS:
            up += tl.load(bias_ptr + N + rn, mask=rn < N, other=0.0).to(tl.float32)
        dtype = y_ptr.dtype.element_ty
        g = y.to(dtype).to(tl.float32)
        silu = (g / (1.0 + tl.exp(-g))).to(dtype)
        y = silu.to(tl.float32) * up.to(dtype).to(tl.float32)
    tl.store(y_ptr + rn, y.to(y_ptr.dtype.element_ty), mask=rn < N)


@functools.lru_cache(maxsize=1024)
def dense_gemv_config(n: int, k: int, silu_and_mul: bool = False) -> GemvConfig:
    """The launch of an [n, k] weight, by shape (block_k capped at next_pow2(k)):

    - silu_and_mul (n = 2N gate | up rows, block_n counts outputs, each two weight rows):
      n <= 8192 (a shared expert) one output of 2048-wide steps on 8 warps, 1 stage, as a
      router; above, 8 outputs of 128-wide steps on 2 warps, 2 stages;
    - n > 65536 (an LM head): 16 rows of 256-wide steps, 4 warps, 2 stages;
    - n <= 513 (a MoE router, E or E + 1 rows with a shared-expert gate): 1, 2 or 4 rows
      for n <= 129, 257, 513, block_k = 2048 / block_n, 8 warps, 1 stage (about 128
      programs: a router GEMV is latency-bound);
    - k < n < 16384 (qkv): 8 rows of 512-wide steps, 4 warps, 2 stages;
    - n < k (down): 8 rows of 512-wide steps, 8 warps, 2 stages;
    - else (o, gate_up without the activation): 4 rows of 1024-wide steps, 2 warps, 1 stage.

    Measured by `python3 examples/bench/kernels.py --only dense --sweep dense` (the kernel
    alone) and end to end by examples/bench/override.py's BENCH_GEMV (batch-1 decode)."""
    if silu_and_mul and n <= 8192:
        bn, bk, warps, stages = 1, 2048, 8, 1
    elif silu_and_mul:
        bn, bk, warps, stages = 8, 128, 2, 2
    elif n > 65536:
        bn, bk, warps, stages = 16, 256, 4, 2
    elif n <= 513:
        bn = 1 if n <= 129 else 2 if n <= 257 else 4
        bk, warps, stages = 2048 // bn, 8, 1
    elif k < n < 16384:
        bn, bk, warps, stages = 8, 512, 4, 2
    elif n < k:
        bn, bk, warps, stages = 8, 512, 8, 2
    else:
        bn, bk, warps, stages = 4, 1024, 2, 1
    return GemvConfig(bn, min(bk, next_pow2(k)), warps, stages)


def check_one_row_gemv(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
                       n: int | None = None) -> tuple[int, int]:
    """The launchers' checks of a one-row GEMV: x [1, K] with a contiguous last dimension,
    w a contiguous [N, K] of x's dtype (N = n when given), bias None or a contiguous [N] of
    x's dtype, one device -> (K, N)."""
    check(x.dim() == 2 and x.shape[0] == 1 and x.stride(1) == 1,
          lambda: f"x must be one row [1, K] "
          f"with a contiguous last dimension, got {tuple(x.shape)} strides {x.stride()}")
    check_float("x", x)
    k = x.shape[1]
    check(k > 0, "x must have K > 0 columns")
    check(w.dim() == 2 and w.shape[1] == k and (n is None or w.shape[0] == n)
          and w.is_contiguous(), lambda: f"w must be a contiguous "
          f"[{'N' if n is None else n}, {k}], got {tuple(w.shape)} strides {w.stride()}")
    n = w.shape[0]
    check(w.dtype == x.dtype, lambda: f"w must be {x.dtype} like x, got {w.dtype}")
    check_same_device(x=x, w=w)
    if bias is not None:
        check(bias.shape == (n,) and bias.is_contiguous() and bias.dtype == x.dtype,
              lambda: f"bias must be a contiguous [{n}] {x.dtype}, got "
              f"{tuple(bias.shape)} {bias.dtype}")
        check_same_device(x=x, bias=bias)
    return k, n


def dense_gemv(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
               silu_and_mul: bool = False,
               config: GemvConfig | None = None) -> torch.Tensor:
    """x: [1, K], w: [N, K], bias: [N] or None -> y: [1, N] in x's dtype; with
    silu_and_mul, w: [2N, K] gate | up rows, bias: [2N] or None -> silu(gate) * up [1, N].
    config: for sweeps; None: dense_gemv_config's."""
    k, rows = check_one_row_gemv(x, w, bias)
    check(not silu_and_mul or rows % 2 == 0,
          lambda: f"w must be [2N, K] gate | up rows with silu_and_mul, got {tuple(w.shape)}")
    n = rows // 2 if silu_and_mul else rows
    y = torch.empty(1, n, dtype=x.dtype, device=x.device)
    if n == 0:
        return y
    cfg = config or dense_gemv_config(rows, k, silu_and_mul)
    _dense_gemv_kernel[(cdiv(n, cfg.block_n),)](
        x, w, bias if bias is not None else w, y, n, k,
        HAS_BIAS=bias is not None, EVEN_K=k % cfg.block_k == 0, SILU_AND_MUL=silu_and_mul,
        BN=cfg.block_n, BK=cfg.block_k, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **pdl_launch(x),
    )
    return y


def dense_gemv_ref(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
                   silu_and_mul: bool = False) -> torch.Tensor:
    """F.linear computed in fp32 and rounded to x's dtype: [M, K] x [N, K] -> [M, N]; with
    silu_and_mul (w [2N, K] gate | up rows), silu_and_mul_ref of that ([M, N],
    kernels/activation.py)."""
    y = F.linear(x.float(), w.float(), None if bias is None else bias.float()).to(x.dtype)
    return silu_and_mul_ref(y) if silu_and_mul else y
