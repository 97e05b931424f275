"""Dense one-row GEMV in Triton: y = x @ w.T (+ bias) for x [1, K], w [N, K], fp32 accumulation.

The batch-1 decode path of the dense linear layers and the LM head (engine/layers/linear.py
dense_linear): at M = 1 cuBLAS runs a GEMV (plus a split-K reduce kernel for some shapes)
that this plain row-block kernel beats on every Llama-3.1-8B weight shape on the H200
(docs/kernels.md). Mirrors vLLM's one-token dense GEMV on ROCm
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
row: computing SiLU-and-mul in its prologue instead made every one of its ~1,000 programs
read the [1, 2N] row and redo the exps. A weight prefetch before the PDL wait (peeling the
first tile) measured slower: it broke Triton's pipelining of the loop.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels._common import (
    cdiv,
    check,
    check_float,
    check_same_device,
    next_pow2,
    pdl_launch,
    pdl_wait,
)
from kernels.activation import silu_and_mul_ref
from kernels.launch_cache import cached_launch


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


def gemv_config(n: int, k: int, silu_and_mul: bool = False) -> tuple[int, int, int, int]:
    """(BN, BK, num_warps, num_stages) for an [n, k] weight, the fastest of a sweep of the
    Llama-3.1-8B shapes on the H200 (docs/kernels.md): 4-row blocks of 1024-wide steps for
    the square and wide weights (o, gate_up), 8-row blocks for qkv (n > k) and down (n < k),
    16-row blocks for an LM head. With silu_and_mul (n = 2N gate | up rows) BN counts
    output values, each two weight rows: 8 in 128-value steps on 2 warps (H200, Llama-3.1-8B
    batch-1 decode: 250.7 tok/s; 8 x 256 on 4 warps 250.3; the plain GEMV's 4-row blocks of
    1024, as 2 + 2 rows, 206); up to 8192 rows (a shared expert's [1024, 2048]) one output
    of 2048-value steps on 8 warps, as a router (Qwen3.5-35B-A3B: 387.7 tok/s; (8, 128, 2,
    2) 344.6, (2, 256, 4, 2) 373.3; 382.5 before the activation moved). A small N (n <=
    513: a MoE router, N = E of K = hidden) takes 1..4-row blocks of 2048-value steps, ~128
    programs for E = 128..512 (8-row blocks were 16 programs for Qwen3-MoE's [128, 2048]
    router: latency-bound; H200 2026-12-02: (1, 2048, 8, 1) 1.52 us, (1, 2048, 4, 2) 1.90,
    (8, 512, 8, 2) 3.14); E + 1 rows (a router merged with a shared-expert gate) take E's
    block, one more program."""
    if silu_and_mul and n <= 8192:  # a shared expert's [1024, 2048]: like a router's
        bn, bk, warps, stages = 1, 2048, 8, 1
    elif silu_and_mul:  # swept end to end on the gate_up [28672, 4096] (session 15)
        bn, bk, warps, stages = 8, 128, 2, 2
    elif n > 65536:
        bn, bk, warps, stages = 16, 256, 4, 2
    elif n <= 513:  # E + 1: Qwen3-Next's router with its shared-expert gate row
        bn = 1 if n <= 129 else 2 if n <= 257 else 4
        bk, warps, stages = 2048 // bn, 8, 1
    elif k < n < 16384:
        bn, bk, warps, stages = 8, 512, 4, 2
    elif n < k:
        bn, bk, warps, stages = 8, 512, 8, 2
    else:
        bn, bk, warps, stages = 4, 1024, 2, 1
    return bn, min(bk, next_pow2(k)), warps, stages


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
               config: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """x: [1, K], w: [N, K], bias: [N] or None -> y: [1, N] in x's dtype; with
    silu_and_mul, w: [2N, K] gate | up rows, bias: [2N] or None -> silu(gate) * up [1, N].
    config: (BN, BK, num_warps, num_stages), for sweeps; None: gemv_config's."""
    k, rows = check_one_row_gemv(x, w, bias)
    check(not silu_and_mul or rows % 2 == 0,
          lambda: f"w must be [2N, K] gate | up rows with silu_and_mul, got {tuple(w.shape)}")
    n = rows // 2 if silu_and_mul else rows
    y = torch.empty(1, n, dtype=x.dtype, device=x.device)
    if n == 0:
        return y
    bn, bk, warps, stages = config or gemv_config(rows, k, silu_and_mul)
    _dense_gemv_kernel[(cdiv(n, bn),)](
        x, w, bias if bias is not None else w, y, n, k,
        HAS_BIAS=bias is not None, EVEN_K=k % bk == 0, SILU_AND_MUL=silu_and_mul, BN=bn, BK=bk,
        num_warps=warps, num_stages=stages,
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
