"""The block-FP8 fused MoE for decode-sized batches as two GEMV launches: w13 + SiLU-and-mul,
w2 + top-k sum, on fp8 experts with [block_n, block_k] weight scales (W8A8).

Owns the sparse decode path of block-FP8 experts (engine/layers/fused_moe/triton_experts.py
fused_experts_triton with use_fp8_w8a8 and a block_shape picks it in the bf16 GEMV's
regime: M * top_k * 4 <= E, SiLU): kernels/fused_moe_gemv.py's two kernels on fp8
weights, half the bytes of the bf16 ones, where the grouped GEMM (kernels/fused_moe.py,
16-row MMA tiles holding one pair) runs four launches at a fraction of HBM bandwidth.
fused_moe_gemv_fp8 runs the four launches of the path:

- per_token_group_quant_fp8(x, block_k) (kernels/fp8_quant.py): x [M, H] -> fp8 rows and
  [M, H / block_k] scales, once (the GEMM path's dynamic quantization, the same kernel).
- fused_moe_gemv_fp8_w13: one program per (pair, BN rows of I), as fused_moe_gemv_w13,
  writing silu(gate) * up [M * top_k, I]. BN divides block_n (which divides I), so the
  program's gate rows share one row of weight scales and its up rows another.
- per_token_group_quant_fp8(act, block_k): the activation rows [M * top_k, I].
- fused_moe_gemv_fp8_w2: one program per (token, BN rows of H), as fused_moe_gemv_w2: a
  [KP, BN, BK] tile of the token's top_k experts' rows, each slot's activation row scaled
  by its routing weight, the slots summed in registers, written [M, H] once.

Each K step multiplies the fp8 activation by its two block scales per column
(x_s[token, k // block_k] * w_s[e, row block, k // block_k]) before the product, as
kernels/fp8_gemv.py does: one multiply per weight element, a [BN, BK] fp32 accumulator
reduced once. The GEMM sums each block_k group's fp8 products and scales the group's sum:
the same W8A8 math summed in another order, both fp32. Nothing is read back on the host
(the scales are device tensors): CUDA graphs capture it, and a batch padded to a larger M
gives the same rows while the padded M stays in the sparse regime.

Behaviour spec: vllm/model_executor/layers/fused_moe/fused_moe.py fused_experts_impl with
use_fp8_w8a8 and block_shape (per-token-group activation quantization, fused_moe_kernel's
group_k > 0 branch, SiluAndMul, moe_sum); vLLM has no GEMV MoE for CUDA. Rounding as
kernels/fused_moe_gemv.py's: gate and up rounded to the output dtype before SiLU-and-mul;
the w2 weighted top-k sum in fp32 rounded once (upstream rounds each pair, then sums).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from libvllm.kernels._common import (
    FLOAT_DTYPES,
    cdiv,
    check,
    check_float,
    check_same_device,
    next_pow2,
    pdl_launch,
    pdl_wait,
)
from libvllm.kernels.fp8_quant import (
    FP8_DTYPE,
    dequantize_fp8,
    per_token_group_quant_fp8,
    per_token_group_quant_fp8_ref,
)
from libvllm.kernels.fused_moe_gemv import (
    MoeGemvConfigs,
    _act_tile,
    _check_routing,
    _silu_mul_store,
    _w2_tile,
)
from libvllm.kernels.launch_cache import cached_launch
from libvllm.kernels.launch_configs import GemvConfig


@cached_launch
@triton.jit
def _fused_moe_gemv_fp8_w13_kernel(
    x_ptr, xs_ptr, w_ptr, ws_ptr, topk_ids_ptr, out_ptr, INTER, H, stride_we, stride_xs,
    stride_wse, stride_wsn, num_blocks, group_n, group_k,
    top_k: tl.constexpr, EVEN_K: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    if USE_PDL:  # the kernels before wrote x's fp8 rows, their scales and the routing
        pdl_wait()
    # one program: BN columns of one pair's SiLU-and-mul output; x row: [H] fp8 with
    # xs [H / group_k]; w rows: gate [BN, H] at rows j, up [BN, H] at rows I + j of w13[e]
    # ([2I, H] fp8, scales ws[e] [2I / group_n, H / group_k]); out: [BN]
    pid = tl.program_id(0)
    pair = (pid // num_blocks).to(tl.int64)
    n0 = (pid % num_blocks) * BN
    rn = n0 + tl.arange(0, BN)  # [BN] rows of the gate half
    e = tl.load(topk_ids_ptr + pair).to(tl.int64)
    tok = pair // top_k
    rk = tl.arange(0, BK)
    row_mask = rn[:, None] < INTER
    w_e = w_ptr + e * stride_we
    gp = w_e + rn[:, None].to(tl.int64) * H + rk[None, :]  # [BN, BK]
    up = w_e + (rn[:, None] + INTER).to(tl.int64) * H + rk[None, :]
    xp = x_ptr + tok * H + rk
    xs_row = xs_ptr + tok * stride_xs
    gs_row = ws_ptr + e * stride_wse + (n0 // group_n) * stride_wsn  # the gate rows' scales
    us_row = ws_ptr + e * stride_wse + ((n0 + INTER) // group_n) * stride_wsn
    acc_g = tl.zeros((BN, BK), dtype=tl.float32)
    acc_u = tl.zeros((BN, BK), dtype=tl.float32)
    for k in range(0, H, BK):
        ks = (k + rk) // group_k  # [BK] scale column of each k
        if EVEN_K:
            x = tl.load(xp).to(tl.float32) * tl.load(xs_row + ks)
            xg = x * tl.load(gs_row + ks)
            xu = x * tl.load(us_row + ks)
            g = tl.load(gp, mask=row_mask, other=0.0, eviction_policy="evict_first")
            u = tl.load(up, mask=row_mask, other=0.0, eviction_policy="evict_first")
        else:
            k_mask = rk < H - k
            x = (tl.load(xp, mask=k_mask, other=0.0).to(tl.float32)
                 * tl.load(xs_row + ks, mask=k_mask, other=0.0))
            xg = x * tl.load(gs_row + ks, mask=k_mask, other=0.0)
            xu = x * tl.load(us_row + ks, mask=k_mask, other=0.0)
            g = tl.load(gp, mask=row_mask & k_mask[None, :], other=0.0,
                        eviction_policy="evict_first")
            u = tl.load(up, mask=row_mask & k_mask[None, :], other=0.0,
                        eviction_policy="evict_first")
        acc_g += g.to(tl.float32) * xg[None, :]
        acc_u += u.to(tl.float32) * xu[None, :]
        gp += BK
        up += BK
        xp += BK
    _silu_mul_store(acc_g, acc_u, out_ptr + pair * INTER, rn, INTER)


@cached_launch
@triton.jit
def _fused_moe_gemv_fp8_w2_kernel(
    a_ptr, as_ptr, w_ptr, ws_ptr, topk_ids_ptr, topk_weights_ptr, out_ptr, H, INTER,
    stride_we, stride_as, stride_wse, stride_wsn, num_blocks, group_n, group_k,
    top_k: tl.constexpr, KP: tl.constexpr, EVEN_K: tl.constexpr, BN: tl.constexpr,
    BK: tl.constexpr, USE_PDL: tl.constexpr,
):
    if USE_PDL:  # the kernels before wrote the routing and the activation rows' fp8
        pdl_wait()
    # one program: BN columns of one token's output; slots padded to KP (a power of two);
    # a rows: [KP, I] fp8 (one per pair) with as [KP, I / group_k]; w rows: [KP, BN, I] fp8
    # (BN rows of w2[e_slot], [H, I]) with ws[e_slot] [H / group_n, I / group_k]
    pid = tl.program_id(0)
    tok = (pid // num_blocks).to(tl.int64)
    n0 = (pid % num_blocks) * BN
    rn = n0 + tl.arange(0, BN)  # [BN] output columns
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
    as_rows = as_ptr + pair[:, None] * stride_as  # [KP, 1]
    ws_rows = ws_ptr + e[:, None] * stride_wse + (n0 // group_n) * stride_wsn  # [KP, 1]
    acc = tl.zeros((BN, BK), dtype=tl.float32)
    for k in range(0, INTER, BK):
        ks = ((k + rk) // group_k)[None, :]  # [1, BK] scale column of each k
        w = _w2_tile(wp, k, INTER, row_mask, rk, EVEN_K)
        s = (_act_tile(as_rows + ks, k, INTER, slot_mask, rk, EVEN_K)
             * _act_tile(ws_rows + ks, k, INTER, slot_mask, rk, EVEN_K))  # [KP, BK]
        # each pair's scales and routing weight folded into its activation row; the slots
        # summed as they load (the slot dim of the tile lies in each thread's registers)
        a = _act_tile(ap, k, INTER, slot_mask, rk, EVEN_K).to(tl.float32) * s * wgt[:, None]
        acc += tl.sum(w.to(tl.float32) * a[:, None, :], axis=0)
        wp += BK
        ap += BK
    y = tl.sum(acc, axis=1)  # [BN] fp32, the weighted top-k sum
    tl.store(out_ptr + tok * H + rn, y.to(out_ptr.dtype.element_ty), mask=rn < H)


@functools.lru_cache(maxsize=256)
def fused_moe_gemv_fp8_config(hidden: int, intermediate: int, top_k: int, block_n: int
                              ) -> MoeGemvConfigs:
    """The launches for H = hidden, I = intermediate and block_n-row weight scales, by rule:
    kernels/fused_moe_gemv.py fused_moe_gemv_config's with block_k doubled (fp8 rows: the
    same bytes a step), w13's 8 rows halved until they divide block_n (which divides I: one
    scale row for the gate rows, one for the up rows). Not yet measured on a GPU: `python3
    examples/bench/benchmark_moe.py --model examples/bench/models/qwen3.5-35b-a3b
    --fp8-gemv --batch-size 1 2 4 8 16` times it against the bf16 GEMV and the FP8 GEMM,
    and sweeps each kernel's (BN, BK, num_warps)."""
    bn = 8
    while block_n % bn:
        bn //= 2
    w13 = GemvConfig(bn, min(512, next_pow2(hidden)), 4, 1)
    kp = next_pow2(top_k)
    bk = 1024 if kp in (2, 4) else 512 if kp <= 8 else 256
    return MoeGemvConfigs(w13, GemvConfig(1, min(bk, next_pow2(intermediate)), 1, 1))


def _check_block_weight(name: str, w: torch.Tensor, w_scale: torch.Tensor, n: int, k: int,
                        block_shape: list[int], like: torch.Tensor) -> None:
    """w: a contiguous fp8 [E, n, k]; w_scale: fp32 [E, cdiv(n, bn), cdiv(k, bk)] with
    contiguous rows, beside `like`."""
    check(w.dim() == 3 and tuple(w.shape[1:]) == (n, k) and w.is_contiguous()
          and w.dtype == FP8_DTYPE,
          lambda: f"{name} must be a contiguous [E, {n}, {k}] float8_e4m3fn, got "
          f"{tuple(w.shape)} {w.dtype}")
    shape = (w.shape[0], cdiv(n, block_shape[0]), cdiv(k, block_shape[1]))
    check(tuple(w_scale.shape) == shape and w_scale.dtype == torch.float32
          and w_scale.stride(2) == 1,
          lambda: f"{name}_scale must be a float32 {list(shape)} with contiguous rows, got "
          f"{tuple(w_scale.shape)} {w_scale.dtype}")
    check_same_device(**{"act": like, name: w, f"{name}_scale": w_scale})


def _check_block_shape(block_shape: list[int], k: int) -> None:
    check(len(block_shape) == 2 and min(block_shape) > 0 and k % block_shape[1] == 0,
          lambda: f"block_shape must be [block_n, block_k] with block_k dividing {k}, got "
          f"{block_shape}")


def _check_act(name: str, a: torch.Tensor, a_scale: torch.Tensor, rows: int,
               block_k: int) -> None:
    """a: a contiguous fp8 [rows, K]; a_scale: fp32 [rows, K / block_k], contiguous rows."""
    check(a.dim() == 2 and a.shape[0] == rows and a.is_contiguous() and a.dtype == FP8_DTYPE,
          lambda: f"{name} must be a contiguous float8_e4m3fn [{rows}, K], got "
          f"{tuple(a.shape)} {a.dtype}")
    groups = a.shape[1] // block_k
    check(tuple(a_scale.shape) == (rows, groups) and a_scale.dtype == torch.float32
          and a_scale.stride(1) == 1,
          lambda: f"{name}_scale must be a float32 [{rows}, {groups}], got "
          f"{tuple(a_scale.shape)} {a_scale.dtype}")


def fused_moe_gemv_fp8_w13(x_q: torch.Tensor, x_scale: torch.Tensor, w13: torch.Tensor,
                           w13_scale: torch.Tensor, topk_ids: torch.Tensor,
                           block_shape: list[int], out_dtype: torch.dtype,
                           config: GemvConfig | None = None) -> torch.Tensor:
    """x_q [M, H] fp8 with x_scale [M, H / bk] (per_token_group_quant_fp8's); w13 [E, 2I, H]
    fp8 (gate | up) with w13_scale [E, 2I / bn, cdiv(H, bk)] (block_shape [bn, bk], bn
    dividing I); topk_ids [M, top_k] int32/int64 -> [M * top_k, I] out_dtype =
    silu(gate) * up per pair (token p // top_k, expert topk_ids.flatten()[p]).
    config: for sweeps; None: fused_moe_gemv_fp8_config's w13."""
    check(out_dtype in FLOAT_DTYPES, lambda: f"out_dtype must be a float dtype, got {out_dtype}")
    check(x_q.dim() == 2, lambda: f"x_q must be [M, H], got {tuple(x_q.shape)}")
    m, h = x_q.shape
    _check_block_shape(block_shape, h)
    _check_act("x_q", x_q, x_scale, m, block_shape[1])
    check(w13.dim() == 3 and w13.shape[1] % 2 == 0,
          lambda: f"w13 must be [E, 2I, {h}], got {tuple(w13.shape)}")
    i = w13.shape[1] // 2
    _check_block_weight("w13", w13, w13_scale, 2 * i, h, block_shape, x_q)
    check(i % block_shape[0] == 0,
          lambda: f"block_n {block_shape[0]} must divide the intermediate size {i}")
    _check_routing(topk_ids, m, "x_q", x_q)
    top_k = topk_ids.shape[1]
    pairs = m * top_k
    out = torch.empty(pairs, i, dtype=out_dtype, device=x_q.device)  # [M * top_k, I]
    if pairs == 0 or i == 0:
        return out
    cfg = config or fused_moe_gemv_fp8_config(h, i, top_k, block_shape[0]).w13
    bn, bk = cfg.block_n, cfg.block_k
    check(block_shape[0] % bn == 0, lambda: f"BN {bn} must divide block_n {block_shape[0]}")
    blocks = cdiv(i, bn)
    _fused_moe_gemv_fp8_w13_kernel[(pairs * blocks,)](
        x_q, x_scale, w13, w13_scale, topk_ids, out, i, h, w13.stride(0), x_scale.stride(0),
        w13_scale.stride(0), w13_scale.stride(1), blocks, block_shape[0], block_shape[1],
        top_k=top_k, EVEN_K=h % bk == 0, BN=bn, BK=bk, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, **pdl_launch(x_q),
    )
    return out


def fused_moe_gemv_fp8_w2(act_q: torch.Tensor, act_scale: torch.Tensor, w2: torch.Tensor,
                          w2_scale: torch.Tensor, topk_weights: torch.Tensor,
                          topk_ids: torch.Tensor, block_shape: list[int],
                          out_dtype: torch.dtype, config: GemvConfig | None = None
                          ) -> torch.Tensor:
    """act_q [M * top_k, I] fp8 with act_scale [M * top_k, I / bk]; w2 [E, H, I] fp8 with
    w2_scale [E, cdiv(H, bn), I / bk]; topk_weights [M, top_k] fp32; topk_ids [M, top_k]
    int32/int64 -> [M, H] out_dtype = sum_k topk_weights[:, k] * (act[pair k] @
    w2[topk_ids[:, k]]^T), summed in fp32 and rounded once."""
    check(out_dtype in FLOAT_DTYPES, lambda: f"out_dtype must be a float dtype, got {out_dtype}")
    _check_routing(topk_ids, None, "act_q", act_q)
    m, top_k = topk_ids.shape
    check(act_q.dim() == 2, lambda: f"act_q must be [M * top_k, I], got {tuple(act_q.shape)}")
    i = act_q.shape[1]
    _check_block_shape(block_shape, i)
    _check_act("act_q", act_q, act_scale, m * top_k, block_shape[1])
    check(w2.dim() == 3, lambda: f"w2 must be [E, H, {i}], got {tuple(w2.shape)}")
    h = w2.shape[1]
    _check_block_weight("w2", w2, w2_scale, h, i, block_shape, act_q)
    check(topk_weights.shape == topk_ids.shape and topk_weights.dtype == torch.float32
          and topk_weights.is_contiguous(),
          lambda: f"topk_weights must be a contiguous float32 [{m}, {top_k}], got "
          f"{tuple(topk_weights.shape)} {topk_weights.dtype}")
    check_same_device(act_q=act_q, topk_weights=topk_weights)
    out = torch.empty(m, h, dtype=out_dtype, device=act_q.device)  # [M, H]
    if m == 0 or h == 0:
        return out
    if top_k == 0 or i == 0:
        return out.zero_()
    cfg = config or fused_moe_gemv_fp8_config(h, i, top_k, block_shape[0]).w2
    bn, bk = cfg.block_n, cfg.block_k
    check(block_shape[0] % bn == 0, lambda: f"BN {bn} must divide block_n {block_shape[0]}")
    blocks = cdiv(h, bn)
    _fused_moe_gemv_fp8_w2_kernel[(m * blocks,)](
        act_q, act_scale, w2, w2_scale, topk_ids, topk_weights, out, h, i, w2.stride(0),
        act_scale.stride(0), w2_scale.stride(0), w2_scale.stride(1), blocks,
        block_shape[0], block_shape[1], top_k=top_k, KP=next_pow2(top_k),
        EVEN_K=i % bk == 0, BN=bn, BK=bk, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, **pdl_launch(act_q),
    )
    return out


def fused_moe_gemv_fp8(x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor,
                       w2: torch.Tensor, w2_scale: torch.Tensor, topk_weights: torch.Tensor,
                       topk_ids: torch.Tensor, block_shape: list[int],
                       configs: MoeGemvConfigs | None = None) -> torch.Tensor:
    """The block-FP8 experts on x [M, H] float (scales and shapes as the two kernels')
    -> [M, H] in x's dtype: x quantized per token group of block_k, the w13 GEMV, its
    activation rows quantized the same way, the w2 GEMV."""
    check_float("x", x)
    check(x.dim() == 2, lambda: f"x must be [M, H], got {tuple(x.shape)}")
    _check_block_shape(block_shape, x.shape[1])
    x_q, x_s = per_token_group_quant_fp8(x.contiguous(), block_shape[1])  # [M, H], [M, H/bk]
    act = fused_moe_gemv_fp8_w13(x_q, x_s, w13, w13_scale, topk_ids, block_shape, x.dtype,
                                 configs.w13 if configs else None)  # [M * top_k, I]
    a_q, a_s = per_token_group_quant_fp8(act, block_shape[1])
    return fused_moe_gemv_fp8_w2(a_q, a_s, w2, w2_scale, topk_weights, topk_ids,
                                 block_shape, x.dtype, configs.w2 if configs else None)


def fused_moe_gemv_fp8_ref(x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor,
                           w2: torch.Tensor, w2_scale: torch.Tensor,
                           topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                           block_shape: list[int]) -> torch.Tensor:
    """What fused_moe_gemv_fp8 computes, in torch: the routed experts' weights dequantized
    by their block scales, the activations quantized per group
    (per_token_group_quant_fp8_ref) and dequantized, the products in fp32 with the kernels'
    roundings (gate and up, SiLU-and-mul in x's dtype; the weighted top-k sum once): [M, H]."""
    m, top_k = topk_ids.shape
    ids = topk_ids.reshape(-1).long()  # [P] expert of each pair

    def qdq(a: torch.Tensor) -> torch.Tensor:  # [rows, K] -> fp32 of its fp8 quantization
        q, s = per_token_group_quant_fp8_ref(a, block_shape[1])
        return dequantize_fp8(q, s, [1, block_shape[1]])

    rows = qdq(x).repeat_interleave(top_k, dim=0)  # [P, H]
    gate_up = torch.einsum("ph,pnh->pn", rows, dequantize_fp8(w13[ids], w13_scale[ids],
                                                              block_shape)).to(x.dtype)
    i = w13.shape[1] // 2
    act = F.silu(gate_up[:, :i]) * gate_up[:, i:]  # [P, I]
    per_pair = torch.einsum("pi,phi->ph", qdq(act), dequantize_fp8(w2[ids], w2_scale[ids],
                                                                   block_shape))  # [P, H]
    weighted = per_pair.view(m, top_k, -1) * topk_weights.float()[:, :, None]
    return weighted.sum(dim=1).to(x.dtype)
