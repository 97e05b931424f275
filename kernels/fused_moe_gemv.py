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
  [M, H] once: no [M, top_k, H] buffer, no moe_sum launch. Each pair's routing weight
  scales its activation row as it loads, so the slots sum in registers and the
  accumulator is [BN, BK].
- fused_moe_gemv_w13_routed / fused_moe_gemv_w2_routed (ROUTED): the same from the router
  logits [M, E] (E <= 512): every program runs its token's softmax top-k in its prologue
  (kernels/moe_topk_softmax.py topk_softmax_row, which topk_softmax itself runs: the same
  experts; the weights up to the order of one fp32 sum; a w13 program needs only its
  slot's expert: topk_softmax_slot, slot + 1 rounds), so the top-k launch goes. The w2
  programs route, and load their first weight tile, before their PDL wait: the logits were
  written two launches back or more (five in the shared-expert path; the w13 kernel waited
  for them before it let w2 launch: kernels/_common.py pdl_wait states the rule).
  The logits may be a [:, :E] view of a wider router output (stride_l its row stride).
- SHARED (fused_moe_gemv_w2_routed's shared_out / shared_gate): the w2 epilogue adds a
  sigmoid-gated shared expert, y = routed + sigmoid(g) * shared_out (Qwen3-Next's block,
  engine/layers/fused_moe/layer.py), so its gate GEMV, sigmoid, multiply and add launches
  go. Rounded as the torch composition in bf16: routed, sigmoid(g) and the product each
  rounded to the dtype, then the sum; the sigmoid's fp32 exp may differ from torch's in
  the last fp32 bit, which can move sigmoid(g) by one ulp of the dtype in rare ties.

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

import functools
from typing import NamedTuple

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
from libvllm.kernels.launch_cache import cached_launch
from libvllm.kernels.launch_configs import GemvConfig
from libvllm.kernels.moe_topk_softmax import topk_softmax_row, topk_softmax_slot


@cached_launch
@triton.jit
def _fused_moe_gemv_w13_kernel(
    x_ptr, w_ptr, topk_ids_ptr, logits_ptr, out_ptr, INTER, H, stride_we, num_blocks,
    E, stride_l,  # INTER: I; E, stride_l: the router logits' (ROUTED)
    top_k: tl.constexpr, ROUTED: tl.constexpr, KP: tl.constexpr, BLOCK_E: tl.constexpr,
    EVEN_K: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, USE_PDL: tl.constexpr,
):
    if USE_PDL:  # the kernels before wrote x and the routing (ids, or the router logits)
        pdl_wait()
    # one program: BN columns of one pair's SiLU-and-mul output; x row: [H],
    # w rows: gate [BN, H] at rows j, up [BN, H] at rows I + j of w13[e] ([2I, H]), out: [BN]
    pid = tl.program_id(0)
    pair = (pid // num_blocks).to(tl.int64)
    rn = (pid % num_blocks) * BN + tl.arange(0, BN)  # [BN] rows of the gate half
    if ROUTED:  # the pair's expert: slot pair % top_k of its token's top-k
        e = topk_softmax_slot(logits_ptr + (pair // top_k) * stride_l, E,
                              (pair % top_k).to(tl.int32), BLOCK_E).to(tl.int64)
    else:
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
    _silu_mul_store(acc_g, acc_u, out_ptr + pair * INTER, rn, INTER)


@triton.jit
def _silu_mul_store(acc_g, acc_u, out_ptr, rn, INTER):
    """SiLU(gate) * up from the [BN, BK] accumulators, rounded as the GEMM path rounds (each
    sum, the SiLU and the product in the output dtype), stored at out_ptr[rn]."""
    dtype = out_ptr.dtype.element_ty
    gate = tl.sum(acc_g, axis=1).to(dtype).to(tl.float32)  # [BN]
    upv = tl.sum(acc_u, axis=1).to(dtype).to(tl.float32)
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype)  # as kernels/activation.py rounds
    tl.store(out_ptr + rn, (silu.to(tl.float32) * upv).to(dtype), mask=rn < INTER)


@triton.jit
def _w2_tile(wp, k, INTER, row_mask, rk, EVEN_K: tl.constexpr):
    """The w2 tile [KP, BN, BK] at column k, loaded evict_first."""
    if EVEN_K:
        return tl.load(wp, mask=row_mask, other=0.0, eviction_policy="evict_first")
    return tl.load(wp, mask=row_mask & (rk < INTER - k)[None, None, :], other=0.0,
                   eviction_policy="evict_first")


@triton.jit
def _act_tile(ap, k, INTER, slot_mask, rk, EVEN_K: tl.constexpr):
    """The activation tile [KP, BK] at column k (one row per pair)."""
    if EVEN_K:
        return tl.load(ap, mask=slot_mask[:, None], other=0.0)
    return tl.load(ap, mask=slot_mask[:, None] & (rk < INTER - k)[None, :], other=0.0)


@cached_launch
@triton.jit
def _fused_moe_gemv_w2_kernel(
    a_ptr, w_ptr, topk_ids_ptr, topk_weights_ptr, logits_ptr, out_ptr, H, INTER, stride_we,
    num_blocks, E, stride_l, shared_ptr, gate_ptr, stride_g,  # shared_ptr, gate_ptr: SHARED's
    top_k: tl.constexpr, ROUTED: tl.constexpr, RENORMALIZE: tl.constexpr, KP: tl.constexpr,
    BLOCK_E: tl.constexpr, EVEN_K: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    SHARED: tl.constexpr, USE_PDL: tl.constexpr,
):
    # one program: BN columns of one token's output; slots padded to KP (a power of two);
    # a rows: [KP, I] (one per pair), w rows: [KP, BN, I] (BN rows of w2[e_slot], [H, I])
    pid = tl.program_id(0)
    tok = (pid // num_blocks).to(tl.int64)
    rn = (pid % num_blocks) * BN + tl.arange(0, BN)  # [BN] output columns
    slot = tl.arange(0, KP)
    slot_mask = slot < top_k
    pair = tok * top_k + slot  # [KP]
    if ROUTED:  # before the wait: the logits were final before the kernel before began
        wgt, e = topk_softmax_row(logits_ptr + tok * stride_l, E, top_k, RENORMALIZE,
                                  BLOCK_E, KP)  # [KP] fp32, [KP] int32
        e = e.to(tl.int64)
    else:
        if USE_PDL:  # the kernels before wrote the routing and the activation rows
            pdl_wait()
        e = tl.load(topk_ids_ptr + pair, mask=slot_mask, other=0).to(tl.int64)
        wgt = tl.load(topk_weights_ptr + pair, mask=slot_mask, other=0.0)  # [KP] fp32
    rk = tl.arange(0, BK)
    row_mask = slot_mask[:, None, None] & (rn < H)[None, :, None]  # [KP, BN, 1]
    wp = (w_ptr + e[:, None, None] * stride_we + rn[None, :, None].to(tl.int64) * INTER
          + rk[None, None, :])  # [KP, BN, BK]
    ap = a_ptr + pair[:, None] * INTER + rk[None, :]  # [KP, BK]
    w = _w2_tile(wp, 0, INTER, row_mask, rk, EVEN_K)  # ROUTED: while the w13 kernel drains
    if ROUTED and USE_PDL:  # the w13 kernel wrote the activation rows
        pdl_wait()
    # each pair's weight folded into its activation row; the slots summed as they load
    # (the slot dim of the tile lies in each thread's registers): acc is [BN, BK]
    a = _act_tile(ap, 0, INTER, slot_mask, rk, EVEN_K).to(tl.float32) * wgt[:, None]
    acc = tl.sum(w.to(tl.float32) * a[:, None, :], axis=0)
    for k in range(BK, INTER, BK):
        wp += BK
        ap += BK
        w = _w2_tile(wp, k, INTER, row_mask, rk, EVEN_K)
        a = _act_tile(ap, k, INTER, slot_mask, rk, EVEN_K).to(tl.float32) * wgt[:, None]
        acc += tl.sum(w.to(tl.float32) * a[:, None, :], axis=0)
    y = tl.sum(acc, axis=1)  # [BN] fp32, the weighted top-k sum
    dtype = out_ptr.dtype.element_ty
    if SHARED:  # + sigmoid(gate) * shared_out, rounded as torch's three bf16 ops round
        g = tl.load(gate_ptr + tok * stride_g).to(tl.float32)  # the token's gate logit
        s = (1.0 / (1.0 + tl.exp(-g))).to(gate_ptr.dtype.element_ty).to(tl.float32)
        so = tl.load(shared_ptr + tok * H + rn, mask=rn < H, other=0.0).to(tl.float32)
        y = y.to(dtype).to(tl.float32) + (s * so).to(dtype).to(tl.float32)
    tl.store(out_ptr + tok * H + rn, y.to(dtype), mask=rn < H)


class MoeGemvConfigs(NamedTuple):
    """The launches of one MoE layer's two GEMVs."""

    w13: GemvConfig
    w2: GemvConfig


@functools.lru_cache(maxsize=256)
def fused_moe_gemv_config(hidden: int, intermediate: int, top_k: int) -> MoeGemvConfigs:
    """The launches for H = hidden, I = intermediate, by rule: w13 8 gate + 8 up rows of
    256-wide steps (capped at next_pow2(H)), 4 warps; w2 one row a program, one warp,
    block_k (capped at next_pow2(I)) by the tile's next_pow2(top_k) slots: 512 for 2 or 4
    slots, 256 for 1 or 8, 128 beyond. num_stages is 1: the loops
    hold no tl.dot, so nothing is pipelined. Measured by `python3
    examples/bench/benchmark_moe.py --gemv-sweep` (each kernel alone) and end to end (every
    layer's weights from HBM) by examples/bench/override.py's BENCH_MOE_W13 / BENCH_MOE_W2
    on batch-1 decode of Qwen3-30B-A3B."""
    w13 = GemvConfig(8, min(256, next_pow2(hidden)), 4, 1)
    kp = next_pow2(top_k)
    bk = 512 if kp in (2, 4) else 256 if kp <= 8 else 128
    return MoeGemvConfigs(w13, GemvConfig(1, min(bk, next_pow2(intermediate)), 1, 1))


ROUTED_MAX_EXPERTS = 512  # the routed kernels hold a token's E logits per program


def _check_routing(topk_ids: torch.Tensor, m: int | None, name: str, like: torch.Tensor
                   ) -> None:
    """topk_ids: a contiguous int32/int64 [m, top_k] (any m when None) beside `like`."""
    check(topk_ids.dim() == 2 and m in (None, topk_ids.shape[0]) and topk_ids.is_contiguous()
          and topk_ids.dtype in (torch.int32, torch.int64),
          lambda: f"topk_ids must be a contiguous int32/int64 [{'M' if m is None else m}, "
          f"top_k], got {tuple(topk_ids.shape)} {topk_ids.dtype}")
    check_same_device(**{name: like, "topk_ids": topk_ids})


def _check_logits(gating_output: torch.Tensor, m: int, top_k: int, name: str,
                  like: torch.Tensor) -> None:
    """gating_output: float [m, E] router logits with contiguous rows, 1 <= top_k <= E <=
    ROUTED_MAX_EXPERTS, beside `like`."""
    check_float("gating_output", gating_output)
    check(gating_output.dim() == 2 and gating_output.shape[0] == m
          and gating_output.stride(1) == 1,
          lambda: f"gating_output must be [{m}, E] with contiguous rows, got "
          f"{tuple(gating_output.shape)} strides {gating_output.stride()}")
    e = gating_output.shape[1]
    check(1 <= top_k <= e <= ROUTED_MAX_EXPERTS,
          lambda: f"top-{top_k} of {e} experts is out of range for the routed GEMV "
          f"(E <= {ROUTED_MAX_EXPERTS})")
    check_same_device(**{name: like, "gating_output": gating_output})


def _routing_args(top_k: int, topk_ids: torch.Tensor | None,
                  gating_output: torch.Tensor | None) -> tuple[tuple, dict]:
    """The kernels' (ids, logits, E, stride_l) arguments and routing constexprs: ids
    given, or the router logits (ROUTED; the unused pointer is the other tensor)."""
    routed = gating_output is not None
    logits = gating_output if routed else topk_ids
    e = gating_output.shape[1] if routed else 1
    args = (topk_ids if topk_ids is not None else logits, logits, e, logits.stride(0))
    return args, {"top_k": top_k, "ROUTED": routed, "KP": next_pow2(top_k),
                  "BLOCK_E": next_pow2(e)}


def _check_x_w13(x: torch.Tensor, w13: torch.Tensor) -> None:
    check(x.dim() == 2 and x.is_contiguous(),
          lambda: f"x must be a contiguous [M, H], got {tuple(x.shape)} strides {x.stride()}")
    check_float("x", x)
    h = x.shape[1]
    check(w13.dim() == 3 and w13.shape[1] % 2 == 0 and w13.shape[2] == h
          and w13.is_contiguous() and w13.dtype == x.dtype,
          lambda: f"w13 must be a contiguous [E, 2I, {h}] {x.dtype}, got "
          f"{tuple(w13.shape)} {w13.dtype}")
    check_same_device(x=x, w13=w13)


def _launch_w13(x: torch.Tensor, w13: torch.Tensor, top_k: int, topk_ids: torch.Tensor | None,
                gating_output: torch.Tensor | None, config: GemvConfig | None) -> torch.Tensor:
    m, h = x.shape
    i = w13.shape[1] // 2
    pairs = m * top_k
    out = torch.empty(pairs, i, dtype=x.dtype, device=x.device)  # [M * top_k, I]
    if pairs == 0 or i == 0:
        return out
    cfg = config or fused_moe_gemv_config(h, i, top_k).w13
    bn, bk = cfg.block_n, cfg.block_k
    blocks = cdiv(i, bn)
    routing, consts = _routing_args(top_k, topk_ids, gating_output)
    _fused_moe_gemv_w13_kernel[(pairs * blocks,)](
        x, w13, routing[0], routing[1], out, i, h, w13.stride(0), blocks, *routing[2:],
        **consts, EVEN_K=h % bk == 0, BN=bn, BK=bk, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **pdl_launch(x),
    )
    return out


def fused_moe_gemv_w13(x: torch.Tensor, w13: torch.Tensor, topk_ids: torch.Tensor,
                       config: GemvConfig | None = None) -> torch.Tensor:
    """x [M, H]; w13 [E, 2I, H] (gate | up); topk_ids [M, top_k] int32/int64
    -> [M * top_k, I] = silu(x @ gate_e^T) * (x @ up_e^T) per pair (token p // top_k,
    expert topk_ids.flatten()[p]), in x's dtype. config: for sweeps; None: fused_moe_gemv_config's
    w13."""
    _check_x_w13(x, w13)
    _check_routing(topk_ids, x.shape[0], "x", x)
    return _launch_w13(x, w13, topk_ids.shape[1], topk_ids, None, config)


def fused_moe_gemv_w13_routed(x: torch.Tensor, w13: torch.Tensor, gating_output: torch.Tensor,
                              top_k: int, config: GemvConfig | None = None) -> torch.Tensor:
    """fused_moe_gemv_w13 routed by the router logits gating_output [M, E] (E <= 512): each
    program takes slot p % top_k of its token's softmax top-k (kernels/moe_topk_softmax.py
    topk_softmax_slot: the ids topk_softmax gives), so no top-k launch runs before."""
    _check_x_w13(x, w13)
    _check_logits(gating_output, x.shape[0], top_k, "x", x)
    return _launch_w13(x, w13, top_k, None, gating_output, config)


def _check_act_w2(act: torch.Tensor, w2: torch.Tensor, m: int, top_k: int) -> None:
    check(act.dim() == 2 and act.is_contiguous(),
          lambda: f"act must be a contiguous [M * top_k, I], got {tuple(act.shape)}")
    check_float("act", act)
    check(act.shape[0] == m * top_k,
          lambda: f"act must have M * top_k = {m * top_k} rows, got {act.shape[0]}")
    i = act.shape[1]
    check(w2.dim() == 3 and w2.shape[2] == i and w2.is_contiguous() and w2.dtype == act.dtype,
          lambda: f"w2 must be a contiguous [E, H, {i}] {act.dtype}, got "
          f"{tuple(w2.shape)} {w2.dtype}")
    check_same_device(act=act, w2=w2)


def _launch_w2(act: torch.Tensor, w2: torch.Tensor, m: int, top_k: int,
               topk_weights: torch.Tensor | None, topk_ids: torch.Tensor | None,
               gating_output: torch.Tensor | None, renormalize: bool,
               config: GemvConfig | None, shared: tuple[torch.Tensor, torch.Tensor] | None = None
               ) -> torch.Tensor:
    h, i = w2.shape[1], act.shape[1]
    out = torch.empty(m, h, dtype=act.dtype, device=act.device)  # [M, H]
    if m == 0 or h == 0:
        return out
    if top_k == 0 or i == 0:
        return out.zero_()
    cfg = config or fused_moe_gemv_config(h, i, top_k).w2
    bn, bk = cfg.block_n, cfg.block_k
    blocks = cdiv(h, bn)
    routing, consts = _routing_args(top_k, topk_ids, gating_output)
    shared_out, gate = shared if shared is not None else (out, out)  # unused without SHARED
    _fused_moe_gemv_w2_kernel[(m * blocks,)](
        act, w2, routing[0], topk_weights if topk_weights is not None else routing[1],
        routing[1], out, h, i, w2.stride(0), blocks, *routing[2:], shared_out, gate,
        gate.stride(0), **consts, RENORMALIZE=renormalize, EVEN_K=i % bk == 0, BN=bn, BK=bk,
        SHARED=shared is not None, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **pdl_launch(act),
    )
    return out


def fused_moe_gemv_w2(act: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                      topk_ids: torch.Tensor, config: GemvConfig | None = None) -> torch.Tensor:
    """act [M * top_k, I] (fused_moe_gemv_w13's); w2 [E, H, I]; topk_weights [M, top_k]
    fp32; topk_ids [M, top_k] int32/int64 -> [M, H] = sum_k topk_weights[:, k] *
    (act[pair k] @ w2[topk_ids[:, k]]^T), summed in fp32 and rounded once to act's dtype."""
    _check_routing(topk_ids, None, "act", act)
    m, top_k = topk_ids.shape
    _check_act_w2(act, w2, m, top_k)
    check(topk_weights.shape == topk_ids.shape and topk_weights.dtype == torch.float32
          and topk_weights.is_contiguous(),
          lambda: f"topk_weights must be a contiguous float32 [{m}, {top_k}], got "
          f"{tuple(topk_weights.shape)} {topk_weights.dtype}")
    check_same_device(act=act, topk_weights=topk_weights)
    return _launch_w2(act, w2, m, top_k, topk_weights, topk_ids, None, False, config)


def _check_shared(shared_out: torch.Tensor, shared_gate: torch.Tensor, act: torch.Tensor,
                  m: int, h: int) -> None:
    """shared_out: a contiguous [m, h] and shared_gate an [m, 1] (any row stride), both of
    act's dtype (the torch path's roundings) and beside act; act has I > 0 columns."""
    check(shared_out.shape == (m, h) and shared_out.is_contiguous()
          and shared_out.dtype == act.dtype and act.shape[1] > 0,
          lambda: f"shared_out must be a contiguous [{m}, {h}] {act.dtype} (and I > 0), got "
          f"{tuple(shared_out.shape)} {shared_out.dtype}")
    check(shared_gate.dim() == 2 and shared_gate.shape == (m, 1)
          and shared_gate.dtype == act.dtype,
          lambda: f"shared_gate must be a [{m}, 1] {act.dtype}, got "
          f"{tuple(shared_gate.shape)} {shared_gate.dtype}")
    check_same_device(act=act, shared_out=shared_out, shared_gate=shared_gate)


def fused_moe_gemv_w2_routed(act: torch.Tensor, w2: torch.Tensor, gating_output: torch.Tensor,
                             top_k: int, renormalize: bool, config: GemvConfig | None = None,
                             shared_out: torch.Tensor | None = None,
                             shared_gate: torch.Tensor | None = None) -> torch.Tensor:
    """fused_moe_gemv_w2 routed by the router logits gating_output [M, E] (E <= 512, any
    row stride: a view of a wider router output), as fused_moe_gemv_w13_routed (weights:
    topk_softmax's, renormalized or not). Each program routes its token and loads its first
    weight tile before its PDL wait, so the logits must be final before the kernel launched
    just before this one starts: launch it right after fused_moe_gemv_w13_routed on the same
    logits (which waits for them).
    With shared_out [M, H] (a shared expert's output, written before the w13 launch) and
    shared_gate [M, 1] (its gate logit), the epilogue adds the sigmoid-gated shared expert:
    y = routed + sigmoid(shared_gate) * shared_out, rounded as torch's bf16 ops (routed,
    sigmoid and the product each rounded to the dtype, then the sum)."""
    m = gating_output.shape[0] if gating_output.dim() == 2 else -1
    _check_logits(gating_output, m, top_k, "act", act)
    _check_act_w2(act, w2, m, top_k)
    shared = None
    if shared_out is not None or shared_gate is not None:
        check(shared_out is not None and shared_gate is not None,
              "shared_out and shared_gate go together")
        _check_shared(shared_out, shared_gate, act, m, w2.shape[1])
        shared = (shared_out, shared_gate)
    return _launch_w2(act, w2, m, top_k, None, None, gating_output, renormalize, config,
                      shared)


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

