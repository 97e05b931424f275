"""Chunked gated delta rule (prefill of Gated DeltaNet layers) over a varlen batch, in Triton.

Same contract as kernels/gated_delta_rule.py fused_recurrent_gated_delta_rule (the math,
state layout [slots, Hv, dv, dk], grouped value heads, in-kernel q/k L2 norm, q scaled by
dk^-0.5, query_start_loc / state_indices / has_initial_state), computed 64 tokens at a time
in the WY / UT form of chunk_gated_delta_rule_torch: per chunk, with gc the cumulative log
decay and A = strictly_lower(beta k k^T * exp(gc_i - gc_j)),
    w = (I + A)^-1 (beta exp(gc) k);  u = (I + A)^-1 (beta v)
    v_new = u - w S;  o = (exp(gc) q) S + causal(q k^T * exp(gc_i - gc_j)) v_new
    S <- exp(gc_last) S + (exp(gc_last - gc) k)^T v_new

Upstream: flash-linear-attention (MIT, Songlin Yang, Yu Zhang) as vendored by vLLM 0.33 in
vllm/third_party/flash_linear_attention/ops/: chunk.py (chunk_gated_delta_rule_fwd: cumsum
-> chunk_scaled_dot_kkt -> solve_tril -> recompute_w_u -> chunk_gated_delta_rule_fwd_h ->
chunk_fwd_o), cumsum.py, chunk_scaled_dot_kkt.py, solve_tril.py (16x16 diagonal blocks by
forward substitution, merged to 64x64), wy_fast.py, chunk_delta_h.py, chunk_o.py, index.py
(prepare_chunk_indices). Own code, fused into two kernels:
- _chunk_wy_fwd_kernel, one program per (chunk, value head): gates (optional), cumsum,
  k k^T, the triangular solve (through a per-chunk fp32 scratch tile) and w, u;
- _chunk_fwd_h_o_kernel, one program per (value block, sequence, head): the state recurrence
  over the chunks with the chunk outputs computed on the way (chunk_delta_h + chunk_o).
Dots take the input dtype (bf16/fp16) with fp32 accumulation as upstream; fp32 inputs and
the triangular solve use exact fp32 ("ieee") dots. The state stays fp32 in registers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from libvllm.kernels._common import check, next_pow2
from libvllm.kernels.gated_delta_rule import check_gdn_inputs, check_sigmoid_gates, gdn_gates
from libvllm.kernels.launch_cache import cached_launch

CHUNK_SIZE = 64  # FLA_CHUNK_SIZE


def prepare_chunk_indices(query_start_loc: list[int], state_indices: list[int],
                          chunk_size: int = CHUNK_SIZE) -> list[int]:
    """Flattened (sequence, chunk) pairs of every chunk of the rows that run (a state slot
    >= 0 and at least one token): index.py prepare_chunk_indices, on host lists."""
    out: list[int] = []
    for i, slot in enumerate(state_indices):
        n = query_start_loc[i + 1] - query_start_loc[i]
        if slot >= 0:
            for c in range(-(-n // chunk_size)):
                out += (i, c)
    return out


@triton.jit
def _inv_unit_lower16(a):
    # a: [16, 16] strictly lower -> (I + a)^-1 by forward substitution (solve_tril_16x16)
    o = tl.arange(0, 16)
    x = -a  # rows < i hold inverse - I once row i is reached
    for i in tl.static_range(1, 16):
        row = tl.sum(tl.where(o[:, None] == i, x, 0.0), 0)
        row = row + tl.sum(row[:, None] * x, 0)
        x = tl.where(o[:, None] == i, row[None, :], x)
    return x + tl.where(o[:, None] == o[None, :], 1.0, 0.0)


@triton.jit
def _blk(a_base, r: tl.constexpr, c: tl.constexpr, BT: tl.constexpr):
    o = tl.arange(0, 16)
    return tl.load(a_base + (16 * r + o)[:, None] * BT + 16 * c + o[None, :])


@triton.jit
def _put(a_base, x, r: tl.constexpr, c: tl.constexpr, BT: tl.constexpr):
    o = tl.arange(0, 16)
    tl.store(a_base + (16 * r + o)[:, None] * BT + 16 * c + o[None, :], x)


@triton.jit
def _mm(a, b):
    return tl.dot(a, b, input_precision="ieee")


@cached_launch
@triton.jit
def _chunk_wy_fwd_kernel(k_ptr, v_ptr, g_ptr, b_ptr, alog_ptr, dtb_ptr, qsl_ptr, cidx_ptr,
                         gc_ptr, a_ptr, w_ptr, u_ptr, stride_k, stride_v, stride_g, stride_b,
                         GATING: tl.constexpr, L2NORM: tl.constexpr, HK: tl.constexpr,
                         HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
                         BK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
                         DOT_PREC: tl.constexpr):
    i_c = tl.program_id(0)
    hv = tl.program_id(1)
    hk = hv // (HV // HK)
    n = tl.load(cidx_ptr + 2 * i_c)
    bos = tl.load(qsl_ptr + n).to(tl.int64) + tl.load(cidx_ptr + 2 * i_c + 1) * BT
    ot = tl.arange(0, BT)  # tiles: scalar base + int32 offsets
    mt = ot < tl.load(qsl_ptr + n + 1).to(tl.int64) - bos  # [BT] token rows of this chunk
    ok = tl.arange(0, BK)
    ov = tl.arange(0, BV)
    DT = k_ptr.dtype.element_ty
    g = tl.load(g_ptr + bos * stride_g + hv + ot * stride_g, mask=mt, other=0.0).to(tl.float32)
    beta = tl.load(b_ptr + bos * stride_b + hv + ot * stride_b, mask=mt,
                   other=0.0).to(tl.float32)
    if GATING:  # raw a, b; rows past the chunk's tokens stay 0
        g, beta = gdn_gates(g, beta, alog_ptr, dtb_ptr, hv)
        g, beta = tl.where(mt, g, 0.0), tl.where(mt, beta, 0.0)
    gc = tl.cumsum(g, 0)  # [BT] cumulative log decay within the chunk
    tl.store(gc_ptr + bos * HV + hv + ot * HV, gc, mask=mt)
    k = tl.load(k_ptr + bos * stride_k + hk * DK + ot[:, None] * stride_k + ok[None, :],
                mask=mt[:, None] & (ok < DK)[None, :], other=0.0)  # [BT, BK] raw k
    rk = tl.full([BT], 1.0, tl.float32)  # the norms scale the products
    if L2NORM:
        kf = k.to(tl.float32)
        rk = rk / tl.sqrt(tl.sum(kf * kf, 1) + 1e-6)
    lower = ot[:, None] > ot[None, :]
    A = tl.dot(k, tl.trans(k), input_precision=DOT_PREC) * (beta * rk)[:, None] * rk[None, :]
    A = tl.where(lower, A * tl.exp(tl.where(lower, gc[:, None] - gc[None, :], 0.0)), 0.0)
    a_base = a_ptr + (i_c * HV + hv).to(tl.int64) * BT * BT  # this program's [BT, BT] tile
    tl.store(a_base + ot[:, None] * BT + ot[None, :], A)
    tl.debug_barrier()
    # (I + A)^-1 from the inverted 16x16 diagonal blocks (solve_tril merge_16x16_to_64x64)
    i00 = _inv_unit_lower16(_blk(a_base, 0, 0, BT))
    i11 = _inv_unit_lower16(_blk(a_base, 1, 1, BT))
    i22 = _inv_unit_lower16(_blk(a_base, 2, 2, BT))
    i33 = _inv_unit_lower16(_blk(a_base, 3, 3, BT))
    a10, a20, a21 = _blk(a_base, 1, 0, BT), _blk(a_base, 2, 0, BT), _blk(a_base, 2, 1, BT)
    a30, a31, a32 = _blk(a_base, 3, 0, BT), _blk(a_base, 3, 1, BT), _blk(a_base, 3, 2, BT)
    i10 = -_mm(i11, _mm(a10, i00))
    i21 = -_mm(i22, _mm(a21, i11))
    i32 = -_mm(i33, _mm(a32, i22))
    i20 = -_mm(i22, _mm(a20, i00) + _mm(a21, i10))
    i31 = -_mm(i33, _mm(a31, i11) + _mm(a32, i21))
    i30 = -_mm(i33, _mm(a30, i00) + _mm(a31, i10) + _mm(a32, i20))
    tl.debug_barrier()
    _put(a_base, i00, 0, 0, BT)
    _put(a_base, i11, 1, 1, BT)
    _put(a_base, i22, 2, 2, BT)
    _put(a_base, i33, 3, 3, BT)
    _put(a_base, i10, 1, 0, BT)
    _put(a_base, i21, 2, 1, BT)
    _put(a_base, i32, 3, 2, BT)
    _put(a_base, i20, 2, 0, BT)
    _put(a_base, i31, 3, 1, BT)
    _put(a_base, i30, 3, 0, BT)
    tl.debug_barrier()
    ai = tl.load(a_base + ot[:, None] * BT + ot[None, :])  # [BT, BT] upper part 0
    # w = ai (beta exp(gc) k_normed), u = ai (beta v): the row scales go to ai's columns
    w = tl.dot((ai * (beta * tl.exp(gc) * rk)[None, :]).to(DT), k, input_precision=DOT_PREC)
    tl.store(w_ptr + (bos * HV + hv) * DK + ot[:, None] * (HV * DK) + ok[None, :],
             w.to(w_ptr.dtype.element_ty), mask=mt[:, None] & (ok < DK)[None, :])
    mv = mt[:, None] & (ov < DV)[None, :]
    v = tl.load(v_ptr + bos * stride_v + hv * DV + ot[:, None] * stride_v + ov[None, :],
                mask=mv, other=0.0)  # [BT, BV]
    u = tl.dot((ai * beta[None, :]).to(DT), v.to(DT), input_precision=DOT_PREC)
    tl.store(u_ptr + (bos * HV + hv) * DV + ot[:, None] * (HV * DV) + ov[None, :],
             u.to(u_ptr.dtype.element_ty), mask=mv)


@cached_launch
@triton.jit
def _chunk_fwd_h_o_kernel(q_ptr, k_ptr, w_ptr, u_ptr, gc_ptr, o_ptr, s_ptr, qsl_ptr, idx_ptr,
                          init_ptr, scale, stride_q, stride_k, stride_o, stride_s: tl.int64,
                          L2NORM: tl.constexpr,
                          HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr,
                          DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                          BT: tl.constexpr, DOT_PREC: tl.constexpr):
    i_v = tl.program_id(0)
    i_nh = tl.program_id(1)
    n = i_nh // HV
    hv = i_nh % HV
    hk = hv // (HV // HK)
    bos = tl.load(qsl_ptr + n).to(tl.int64)
    eos = tl.load(qsl_ptr + n + 1).to(tl.int64)
    slot = tl.load(idx_ptr + n).to(tl.int64)
    eos = tl.where(slot >= 0, eos, bos)  # skipped rows do nothing
    ok = tl.arange(0, BK)
    ov = i_v * BV + tl.arange(0, BV)
    ot = tl.arange(0, BT)
    mk = ok < DK
    mv = ov < DV
    DT = k_ptr.dtype.element_ty
    # state tile h [BK, BV] = S^T of the slot's [dv, dk] rows (fp32 while in registers)
    s_off = s_ptr + slot * stride_s + hv * DV * DK + ov[None, :] * DK + ok[:, None]
    dv_init = tl.where((tl.load(init_ptr + n).to(tl.int32) != 0) & (slot >= 0), DV, 0)
    h = tl.load(s_off, mask=mk[:, None] & (ov < dv_init)[None, :], other=0.0).to(tl.float32)
    causal = ot[:, None] >= ot[None, :]
    for t0 in range(bos, eos, BT):
        mt = ot < eos - t0  # [BT] rows of this chunk; tiles: scalar base + int32 offsets
        mtk = mt[:, None] & mk[None, :]
        q = tl.load(q_ptr + t0 * stride_q + hk * DK + ot[:, None] * stride_q + ok[None, :],
                    mask=mtk, other=0.0)  # [BT, BK] raw q, k: the norms scale the products
        k = tl.load(k_ptr + t0 * stride_k + hk * DK + ot[:, None] * stride_k + ok[None, :],
                    mask=mtk, other=0.0)
        rq = tl.full([BT], 1.0, tl.float32) * scale
        rk = tl.full([BT], 1.0, tl.float32)
        if L2NORM:
            qf = q.to(tl.float32)
            kf = k.to(tl.float32)
            rq = rq / tl.sqrt(tl.sum(qf * qf, 1) + 1e-6)
            rk = rk / tl.sqrt(tl.sum(kf * kf, 1) + 1e-6)
        gc_base = gc_ptr + t0 * HV + hv
        gc = tl.load(gc_base + ot * HV, mask=mt, other=0.0)  # [BT]
        g_last = tl.load(gc_base + (tl.minimum(eos - t0, BT) - 1) * HV)
        w = tl.load(w_ptr + (t0 * HV + hv) * DK + ot[:, None] * (HV * DK) + ok[None, :],
                    mask=mtk, other=0.0)  # [BT, BK]
        u = tl.load(u_ptr + (t0 * HV + hv) * DV + ot[:, None] * (HV * DV) + ov[None, :],
                    mask=mt[:, None] & mv[None, :], other=0.0).to(tl.float32)  # [BT, BV]
        hd = h.to(DT)
        v_new = u - tl.dot(w, hd, input_precision=DOT_PREC)  # [BT, BV]
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)  # [BT, BT]
        qk = tl.where(causal, qk * rk[None, :] * tl.exp(
            tl.where(causal, gc[:, None] - gc[None, :], 0.0)), 0.0)
        o = tl.dot(qk.to(DT), v_new.to(DT), input_precision=DOT_PREC)
        o = o + tl.exp(gc)[:, None] * tl.dot(q, hd, input_precision=DOT_PREC)
        o = o * rq[:, None]
        tl.store(o_ptr + t0 * stride_o + hv * DV + ot[:, None] * stride_o + ov[None, :],
                 o.to(o_ptr.dtype.element_ty), mask=mt[:, None] & mv[None, :])
        v_new = v_new * (rk * tl.exp(g_last - gc))[:, None]
        h = h * tl.exp(g_last) + tl.dot(tl.trans(k), v_new.to(DT), input_precision=DOT_PREC)
    dv_out = tl.where(eos > bos, DV, 0)
    tl.store(s_off, h.to(s_ptr.dtype.element_ty), mask=mk[:, None] & (ov < dv_out)[None, :])


def chunk_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           g: torch.Tensor, beta: torch.Tensor, ssm_states: torch.Tensor,
                           query_start_loc: torch.Tensor, state_indices: torch.Tensor,
                           has_initial_state: torch.Tensor, l2norm: bool = True,
                           chunk_indices: torch.Tensor | None = None,
                           out: torch.Tensor | None = None) -> torch.Tensor:
    """q, k: [T, Hk, dk]; v: [T, Hv, dv]; g, beta: [T, Hv]; ssm_states: [slots, Hv, dv, dk]
    read (rows with an initial state) and written in place; query_start_loc: [N+1] int32;
    state_indices: [N] (negative: skip); chunk_indices: [C, 2] int32 from
    prepare_chunk_indices (computed here, with a host sync, when None) -> o [T, Hv, dv] in
    v's dtype (`out` when given: rows of skipped sequences keep their values)."""
    return _launch(q, k, v, g, beta, None, None, ssm_states, query_start_loc, state_indices,
                   has_initial_state, l2norm, chunk_indices, out)


def chunk_sigmoid_gating_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
                                    dt_bias: torch.Tensor, ssm_states: torch.Tensor,
                                    query_start_loc: torch.Tensor, state_indices: torch.Tensor,
                                    has_initial_state: torch.Tensor,
                                    chunk_indices: torch.Tensor | None = None,
                                    out: torch.Tensor | None = None) -> torch.Tensor:
    """chunk_gated_delta_rule with the gates computed in the kernel from the raw projections
    a, b ([T, Hv], rows may be strided) and A_log, dt_bias ([Hv]), as
    kernels/gated_delta_rule.py fused_sigmoid_gating_delta_rule."""
    check_sigmoid_gates(A_log, dt_bias, v.shape[1])
    return _launch(q, k, v, a, b, A_log, dt_bias, ssm_states, query_start_loc, state_indices,
                   has_initial_state, True, chunk_indices, out)


def _launch(q, k, v, g, beta, A_log, dt_bias, ssm_states, query_start_loc, state_indices,
            has_initial_state, l2norm: bool, chunk_indices, out) -> torch.Tensor:
    T, HK, DK = k.shape
    HV, DV = v.shape[1:]
    N = state_indices.shape[0]
    check_gdn_inputs(q, k, v, g, beta, ssm_states)
    o = torch.zeros(T, HV, DV, dtype=v.dtype, device=v.device) if out is None else out
    check(o.shape == v.shape and o.dtype == v.dtype and o.is_contiguous(),
          "out must be contiguous like v")
    if chunk_indices is None:
        chunk_indices = torch.tensor(
            prepare_chunk_indices(query_start_loc.tolist(), state_indices.tolist()),
            dtype=torch.int32, device=v.device).view(-1, 2)
    C = chunk_indices.shape[0]
    if N == 0 or T == 0 or C == 0:
        return o
    BK, BV, BT = max(16, next_pow2(DK)), max(16, next_pow2(DV)), CHUNK_SIZE  # dots: >= 16
    prec = "ieee" if k.dtype == torch.float32 else "tf32"  # tf32: unused on 16-bit operands
    gc = torch.empty(T, HV, dtype=torch.float32, device=v.device)  # [T, Hv]
    scratch = torch.empty(C, HV, BT, BT, dtype=torch.float32, device=v.device)
    w = torch.empty(T, HV, DK, dtype=k.dtype, device=v.device)  # [T, Hv, dk]
    u = torch.empty(T, HV, DV, dtype=k.dtype, device=v.device)  # [T, Hv, dv]
    gating = A_log is not None
    _chunk_wy_fwd_kernel[(C, HV)](
        k, v, g, beta, A_log if gating else g, dt_bias if gating else g, query_start_loc,
        chunk_indices, gc, scratch, w, u, k.stride(0), v.stride(0), g.stride(0),
        beta.stride(0), GATING=gating, L2NORM=l2norm, HK=HK, HV=HV, DK=DK, DV=DV, BK=BK,
        BV=BV, BT=BT, DOT_PREC=prec, num_warps=8)
    BV = min(32, BV)  # the recurrence's value block; fp32 (FMA) dots get one stage (smem)
    _chunk_fwd_h_o_kernel[(triton.cdiv(DV, BV), N * HV)](
        q, k, w, u, gc, o, ssm_states, query_start_loc, state_indices,
        has_initial_state, DK ** -0.5, q.stride(0), k.stride(0), o.stride(0),
        ssm_states.stride(0), L2NORM=l2norm, HK=HK, HV=HV, DK=DK, DV=DV, BK=BK, BV=BV, BT=BT,
        DOT_PREC=prec,
        num_warps=8, num_stages=1 if k.dtype == torch.float32 else 2)
    return o
