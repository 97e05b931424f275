"""The fused MoE for decode-sized batches as two GEMV launches: w13 + SiLU-and-mul, w2 + top-k sum.

Owns the sparse decode path of engine/layers/fused_moe/triton_experts.py (fused_experts_triton
picks it when M * top_k * 4 <= E, upstream's naive_block_assignment regime, and the
activation is SiLU): batch-1..4 decode of Qwen3-30B-A3B (E = 128, top-8) reads 8..32
experts' weights, and there the grouped GEMM (kernels/fused_moe.py, 16-row blocks holding
one pair) streams them at ~65% of HBM bandwidth, in four launches (w13, SiLU-and-mul, w2,
the top-k sum). Here:

- fused_moe_gemv_w13: one program per (pair, BN rows of I). It streams rows j of w13[e]'s
  gate half and rows I + j of its up half against the pair's hidden row and writes
  silu(gate) * up, so the [M * top_k, 2I] gate|up buffer and the SiLU-and-mul launch go.
- fused_moe_gemv_w2: one program per (token, BN rows of H). It streams those rows of
  every one of the token's top_k experts' w2 in one [KP, BN, BK] tile (KP =
  next_pow2(top_k), the extra slots masked) against each pair's activation row, weights
  each expert's dot products by topk_weights (fp32) and sums them in fp32, writing
  [M, H] once: no [M, top_k, H] buffer, no moe_sum launch.

The style is kernels/gemv.py's _dense_gemv_kernel (BN rows in BK-wide steps into an fp32
[BN, BK] accumulator reduced once, weights loaded evict_first, PDL on sm_90+). Each output
row depends only on its own token, so a CUDA graph padded to a larger M gives the same rows
as long as the padded M still takes this path (M * top_k * 4 <= E; for Qwen3-Next, E 512
and top-10, batches of 9 to 12 pad to 16 and run the GEMM path, which rounds each pair
before the top-k sum).

Behaviour spec: vllm/model_executor/layers/fused_moe/fused_moe.py fused_experts_impl
(unquantized, no expert map: w13 GEMM, SiluAndMul, w2 GEMM with the routing weight in the
fp32 epilogue, moe_sum); vLLM has no GEMV MoE for CUDA. Rounding: the gate and up dot
products are rounded to the activation dtype, then SiLU-and-mul rounds as
kernels/activation.py (silu in fp32 rounded, product in fp32 rounded): the w13 output is
what fused_moe_kernel + silu_and_mul write, up to the order of the fp32 sums. The w2
output differs: upstream (and the engine's grouped path) rounds each pair's weighted
output to the activation dtype and sums those; here the weighted sum is one fp32 sum
rounded once, at most top_k / 2 ulps of a pair output apart in bf16 (within the fused MoE
tests' bf16 tolerance); fp32 inputs stay fp32 arithmetic throughout. topk_ids may be int32
or int64 (no expert map: every id must be in [0, E)).
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


@triton.jit
def _fused_moe_gemv_w13_kernel(
    x_ptr, w_ptr, topk_ids_ptr, out_ptr, INTER, H, stride_we, num_blocks,  # INTER: I
    top_k: tl.constexpr, EVEN_K: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    if USE_PDL:  # the kernels before wrote x and the routing
        pdl_wait()
    # one program: BN columns of one pair's SiLU-and-mul output; x row: [H],
    # w rows: gate [BN, H] at rows j, up [BN, H] at rows I + j of w13[e] ([2I, H]), out: [BN]
    pid = tl.program_id(0)
    pair = (pid // num_blocks).to(tl.int64)
    rn = (pid % num_blocks) * BN + tl.arange(0, BN)  # [BN] rows of the gate half
    e = tl.load(topk_ids_ptr + pair).to(tl.int64)
    rk = tl.arange(0, BK)
    row_mask = rn[:, None] < INTER
    w_e = w_ptr + e * stride_we
    gp = w_e + rn[:, None].to(tl.int64) * H + rk[None, :]  # [BN, BK]
    up = w_e + (rn[:, None] + INTER).to(tl.int64) * H + rk[None, :]
    xp = x_ptr + (pair // top_k) * H + rk
    acc_g = tl.zeros((BN, BK), dtype=tl.float32)
    acc_u = tl.zeros((BN, BK), dtype=tl.float32)
    for k in range(0, H, BK):
        if EVEN_K:
            x = tl.load(xp)
            g = tl.load(gp, mask=row_mask, other=0.0, eviction_policy="evict_first")
            u = tl.load(up, mask=row_mask, other=0.0, eviction_policy="evict_first")
        else:
            k_mask = rk < H - k
            x = tl.load(xp, mask=k_mask, other=0.0)
            g = tl.load(gp, mask=row_mask & k_mask[None, :], other=0.0,
                        eviction_policy="evict_first")
            u = tl.load(up, mask=row_mask & k_mask[None, :], other=0.0,
                        eviction_policy="evict_first")
        xf = x.to(tl.float32)[None, :]
        acc_g += g.to(tl.float32) * xf
        acc_u += u.to(tl.float32) * xf
        gp += BK
        up += BK
        xp += BK
    dtype = out_ptr.dtype.element_ty
    gate = tl.sum(acc_g, axis=1).to(dtype).to(tl.float32)  # [BN], the GEMM's rounding
    upv = tl.sum(acc_u, axis=1).to(dtype).to(tl.float32)
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype)  # as kernels/activation.py rounds
    y = (silu.to(tl.float32) * upv).to(dtype)
    tl.store(out_ptr + pair * INTER + rn, y, mask=rn < INTER)


@triton.jit
def _fused_moe_gemv_w2_kernel(
    a_ptr, w_ptr, topk_ids_ptr, topk_weights_ptr, out_ptr, H, INTER, stride_we, num_blocks,
    top_k: tl.constexpr, KP: tl.constexpr, EVEN_K: tl.constexpr, BN: tl.constexpr,
    BK: tl.constexpr, USE_PDL: tl.constexpr,
):
    if USE_PDL:  # the w13 kernel wrote the activation rows
        pdl_wait()
    # one program: BN columns of one token's output; slots padded to KP (a power of two);
    # a rows: [KP, I] (one per pair), w rows: [KP, BN, I] (BN rows of w2[e_slot], [H, I])
    pid = tl.program_id(0)
    tok = (pid // num_blocks).to(tl.int64)
    rn = (pid % num_blocks) * BN + tl.arange(0, BN)  # [BN] output columns
    slot = tl.arange(0, KP)
    slot_mask = slot < top_k
    pair = tok * top_k + slot  # [KP]
    e = tl.load(topk_ids_ptr + pair, mask=slot_mask, other=0).to(tl.int64)
    wgt = tl.load(topk_weights_ptr + pair, mask=slot_mask, other=0.0)  # [KP] fp32
    rk = tl.arange(0, BK)
    row_mask = slot_mask[:, None, None] & (rn < H)[None, :, None]  # [KP, BN, 1]
    wp = (w_ptr + e[:, None, None] * stride_we + rn[None, :, None].to(tl.int64) * INTER
          + rk[None, None, :])  # [KP, BN, BK]
    ap = a_ptr + pair[:, None] * INTER + rk[None, :]  # [KP, BK]
    acc = tl.zeros((KP, BN, BK), dtype=tl.float32)
    for k in range(0, INTER, BK):
        if EVEN_K:
            a = tl.load(ap, mask=slot_mask[:, None], other=0.0)
            w = tl.load(wp, mask=row_mask, other=0.0, eviction_policy="evict_first")
        else:
            k_mask = rk < INTER - k
            a = tl.load(ap, mask=slot_mask[:, None] & k_mask[None, :], other=0.0)
            w = tl.load(wp, mask=row_mask & k_mask[None, None, :], other=0.0,
                        eviction_policy="evict_first")
        acc += w.to(tl.float32) * a.to(tl.float32)[:, None, :]
        wp += BK
        ap += BK
    y = tl.sum(acc, axis=2) * wgt[:, None]  # [KP, BN] weighted, per pair
    y = tl.sum(y, axis=0)  # [BN] fp32, the top-k sum
    tl.store(out_ptr + tok * H + rn, y.to(out_ptr.dtype.element_ty), mask=rn < H)


Config = tuple[int, int, int, int]  # (BN, BK, num_warps, num_stages)


def fused_moe_gemv_config(hidden: int, intermediate: int, top_k: int) -> tuple[Config, Config]:
    """(w13 config, w2 config) for H = hidden, I = intermediate: (BN, BK, num_warps,
    num_stages). Swept on the H200 for the Qwen3-30B-A3B layer (examples/bench/
    benchmark_moe.py --gemv-sweep, 2026-12-01): w13 4 gate + 4 up rows of 256-wide steps, 2
    warps (M=1 13.5 us, 87% of HBM; 8 rows took 16.2 us; at M=4 8 rows of 128 were 2%
    faster); w2 a [KP, BN, BK] tile of 4096 values, 2 warps (top-8: BN 2, BK 256, best at
    M=2 and 4, 5% slower than BN 4 at M=1; top-2: BN 4, BK 512, not swept). num_stages
    changes nothing (no tl.dot: nothing is pipelined, the PTX is the same for 1..3)."""
    w13 = (4, min(256, next_pow2(hidden)), 2, 1)
    kp = next_pow2(top_k)
    bk = 512 if kp in (2, 4) else 256 if kp <= 8 else 128
    w2 = (max(1, 4096 // (kp * bk)), min(bk, next_pow2(intermediate)), 2, 1)
    return w13, w2


def _check_routing(topk_ids: torch.Tensor, m: int | None, name: str, like: torch.Tensor
                   ) -> None:
    """topk_ids: a contiguous int32/int64 [m, top_k] (any m when None) beside `like`."""
    check(topk_ids.dim() == 2 and m in (None, topk_ids.shape[0]) and topk_ids.is_contiguous()
          and topk_ids.dtype in (torch.int32, torch.int64),
          lambda: f"topk_ids must be a contiguous int32/int64 [{'M' if m is None else m}, "
          f"top_k], got {tuple(topk_ids.shape)} {topk_ids.dtype}")
    check_same_device(**{name: like, "topk_ids": topk_ids})


def fused_moe_gemv_w13(x: torch.Tensor, w13: torch.Tensor, topk_ids: torch.Tensor,
                       config: Config | None = None) -> torch.Tensor:
    """x [M, H]; w13 [E, 2I, H] (gate | up); topk_ids [M, top_k] int32/int64
    -> [M * top_k, I] = silu(x @ gate_e^T) * (x @ up_e^T) per pair (token p // top_k,
    expert topk_ids.flatten()[p]), in x's dtype. config: (BN, BK, num_warps, num_stages),
    for sweeps; None: fused_moe_gemv_config's."""
    check(x.dim() == 2 and x.is_contiguous(),
          lambda: f"x must be a contiguous [M, H], got {tuple(x.shape)} strides {x.stride()}")
    check_float("x", x)
    m, h = x.shape
    check(w13.dim() == 3 and w13.shape[1] % 2 == 0 and w13.shape[2] == h
          and w13.is_contiguous() and w13.dtype == x.dtype,
          lambda: f"w13 must be a contiguous [E, 2I, {h}] {x.dtype}, got "
          f"{tuple(w13.shape)} {w13.dtype}")
    check_same_device(x=x, w13=w13)
    _check_routing(topk_ids, m, "x", x)
    i = w13.shape[1] // 2
    pairs = topk_ids.numel()
    out = torch.empty(pairs, i, dtype=x.dtype, device=x.device)  # [M * top_k, I]
    if pairs == 0 or i == 0:
        return out
    bn, bk, warps, stages = config or fused_moe_gemv_config(h, i, topk_ids.shape[1])[0]
    blocks = cdiv(i, bn)
    _fused_moe_gemv_w13_kernel[(pairs * blocks,)](
        x, w13, topk_ids, out, i, h, w13.stride(0), blocks,
        top_k=topk_ids.shape[1], EVEN_K=h % bk == 0, BN=bn, BK=bk,
        num_warps=warps, num_stages=stages, **pdl_launch(x),
    )
    return out


def fused_moe_gemv_w2(act: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                      topk_ids: torch.Tensor, config: Config | None = None) -> torch.Tensor:
    """act [M * top_k, I] (fused_moe_gemv_w13's); w2 [E, H, I]; topk_weights [M, top_k]
    fp32; topk_ids [M, top_k] int32/int64 -> [M, H] = sum_k topk_weights[:, k] *
    (act[pair k] @ w2[topk_ids[:, k]]^T), summed in fp32 and rounded once to act's dtype."""
    check(act.dim() == 2 and act.is_contiguous(),
          lambda: f"act must be a contiguous [M * top_k, I], got {tuple(act.shape)}")
    check_float("act", act)
    _check_routing(topk_ids, None, "act", act)
    m, top_k = topk_ids.shape
    check(act.shape[0] == m * top_k,
          lambda: f"act must have M * top_k = {m * top_k} rows, got {act.shape[0]}")
    i = act.shape[1]
    check(w2.dim() == 3 and w2.shape[2] == i and w2.is_contiguous() and w2.dtype == act.dtype,
          lambda: f"w2 must be a contiguous [E, H, {i}] {act.dtype}, got "
          f"{tuple(w2.shape)} {w2.dtype}")
    check(topk_weights.shape == topk_ids.shape and topk_weights.dtype == torch.float32
          and topk_weights.is_contiguous(),
          lambda: f"topk_weights must be a contiguous float32 [{m}, {top_k}], got "
          f"{tuple(topk_weights.shape)} {topk_weights.dtype}")
    check_same_device(act=act, w2=w2, topk_weights=topk_weights)
    h = w2.shape[1]
    out = torch.empty(m, h, dtype=act.dtype, device=act.device)  # [M, H]
    if m == 0 or h == 0:
        return out
    if top_k == 0 or i == 0:
        return out.zero_()
    bn, bk, warps, stages = config or fused_moe_gemv_config(h, i, top_k)[1]
    blocks = cdiv(h, bn)
    _fused_moe_gemv_w2_kernel[(m * blocks,)](
        act, w2, topk_ids, topk_weights, out, h, i, w2.stride(0), blocks,
        top_k=top_k, KP=next_pow2(top_k), EVEN_K=i % bk == 0, BN=bn, BK=bk,
        num_warps=warps, num_stages=stages, **pdl_launch(act),
    )
    return out


def fused_moe_gemv_w13_ref(x: torch.Tensor, w13: torch.Tensor, topk_ids: torch.Tensor
                           ) -> torch.Tensor:
    """What fused_moe_gemv_w13 writes: the GEMM in fp32 rounded once to x's dtype, then
    torch's SiLU-and-mul in that dtype (engine/layers/activation.py): [M * top_k, I]."""
    top_k = topk_ids.shape[1]
    rows = x.float().repeat_interleave(top_k, dim=0)  # [P, H]
    w = w13.float()[topk_ids.reshape(-1).long()]  # [P, 2I, H]
    gate_up = torch.einsum("ph,pnh->pn", rows, w).to(x.dtype)
    i = w13.shape[1] // 2
    return F.silu(gate_up[:, :i]) * gate_up[:, i:]


def fused_moe_gemv_w2_ref(act: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                          topk_ids: torch.Tensor) -> torch.Tensor:
    """What fused_moe_gemv_w2 writes: the weighted top-k sum in fp32, rounded once: [M, H]."""
    m, top_k = topk_ids.shape
    w = w2.float()[topk_ids.reshape(-1).long()]  # [P, H, I]
    per_pair = torch.einsum("pi,phi->ph", act.float(), w)  # [P, H]
    weighted = per_pair.view(m, top_k, -1) * topk_weights.float()[:, :, None]
    return weighted.sum(dim=1).to(act.dtype)
