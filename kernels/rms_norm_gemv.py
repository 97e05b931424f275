"""Fused residual-add + RMSNorm with the MoE router GEMV of one token, in Triton.

Batch-1 decode of a Qwen3-MoE layer (engine/models/qwen3_moe.py Qwen3MoeDecoderLayer
._mlp_block): the post-attention norm (kernels/rms_norm.py fused_add_rms_norm's work) and
the router logits of its output (kernels/gemv.py dense_gemv's work on the [E, hidden]
gate), one launch instead of two. The behaviour is vLLM's pair of ops,
vllm/model_executor/layers/layernorm.py (RMSNorm.forward_cuda: ops.fused_add_rms_norm)
then the router's ReplicatedLinear (vllm/model_executor/models/qwen3_moe.py self.gate);
vLLM has no such fusion.

Every program holds the whole row (BLOCK = next_pow2(hidden), no K loop): it computes the
sum and norm with kernels/rms_norm.py's rms_norm_row at its norm_warps (the
residual sum rounded to the dtype, statistics in fp32, one rounding), program 0 stores
them, and each program takes BN router rows (dense_gemv_config's small-N rule) against the
rounded norm output in fp32, rounded once. Out of place: every program reads x and
residual, so none may write them. The router and norm weights are loaded before the PDL
wait (weights, never written during a step: kernels/_common.py pdl_wait).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from libvllm.kernels._common import cdiv, check, check_same_device, next_pow2, pdl_launch, pdl_wait
from libvllm.kernels.gemv import check_one_row_gemv, dense_gemv_config, dense_gemv_ref
from libvllm.kernels.launch_cache import cached_launch
from libvllm.kernels.rms_norm import check_norm_weight, norm_warps, rms_norm_ref, rms_norm_row

MAX_N, MAX_HIDDEN = 513, 8192  # E + 1 router rows; one row held in registers


@cached_launch
@triton.jit
def _fused_add_rms_norm_gemv_kernel(
    x_ptr, res_ptr, nw_ptr, w_ptr, out_ptr, res_out_ptr, y_ptr, N, hidden, eps, weight_offset,
    BN: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr,
):
    # one program: BN router rows; x, res, out, res_out, nw: [hidden];
    # w rows: [BN, hidden] (row stride hidden), y: [BN]
    rn = tl.program_id(0) * BN + tl.arange(0, BN)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    w = tl.load(w_ptr + rn[:, None] * hidden + cols[None, :],
                mask=(rn[:, None] < N) & mask[None, :], other=0.0)  # [BN, BLOCK]
    nw = tl.load(nw_ptr + cols, mask=mask, other=0.0).to(tl.float32) + weight_offset
    if USE_PDL:  # the kernel before wrote x and residual
        pdl_wait()
    x = tl.load(x_ptr + cols, mask=mask, other=0.0)
    r = tl.load(res_ptr + cols, mask=mask, other=0.0)
    x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)  # rounded like torch's x + r
    out = rms_norm_row(x, nw, hidden, eps).to(x.dtype)  # [BLOCK]
    if tl.program_id(0) == 0:
        tl.store(res_out_ptr + cols, x, mask=mask)
        tl.store(out_ptr + cols, out, mask=mask)
    y = tl.sum(w.to(tl.float32) * out.to(tl.float32)[None, :], axis=1)  # [BN] fp32
    tl.store(y_ptr + rn, y.to(y_ptr.dtype.element_ty), mask=rn < N)


def fused_add_rms_norm_gemv(
    x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float,
    w: torch.Tensor, weight_offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x, residual: [1, hidden], norm_weight: [hidden], w: [N, hidden] (no bias) -> new
    (out, residual_out, y) in x's dtype: residual_out [1, hidden] = x + residual, out
    [1, hidden] = rms_norm(residual_out) * (norm_weight + weight_offset), y [1, N] =
    out @ w.T. x and residual are not modified."""
    h, n = check_one_row_gemv(x, w, None)
    check(residual.shape == x.shape and residual.dtype == x.dtype
          and residual.stride(1) == 1, "residual must match x's shape and dtype")
    check_same_device(x=x, residual=residual)
    check_norm_weight(norm_weight, h, weight_offset, x, "norm_weight")
    check(1 <= n <= MAX_N, lambda: f"w must have 1..{MAX_N} rows, got {n}")
    check(h <= MAX_HIDDEN, lambda: f"hidden size {h} is larger than this kernel's "
          f"{MAX_HIDDEN} limit")
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    residual_out = torch.empty_like(out)
    y = torch.empty(1, n, dtype=x.dtype, device=x.device)
    bn = dense_gemv_config(n, h).block_n  # the router GEMV's rows a program (its small-N rule)
    block = next_pow2(h)
    _fused_add_rms_norm_gemv_kernel[(cdiv(n, bn),)](
        x, residual, norm_weight, w, out, residual_out, y, n, h, float(eps),
        float(weight_offset), BN=bn, BLOCK=block, num_warps=norm_warps(block),
        **pdl_launch(x),
    )
    return out, residual_out, y


def fused_add_rms_norm_gemv_ref(
    x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float,
    w: torch.Tensor, weight_offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The unfused path in torch: rms_norm_ref with the residual, then dense_gemv_ref (F.linear
    in fp32 rounded to x's dtype) of its output."""
    out, residual_out = rms_norm_ref(x, norm_weight, eps, residual, weight_offset)
    return out, residual_out, dense_gemv_ref(out, w)
