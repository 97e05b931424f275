"""Gated delta rule (Gated DeltaNet linear attention) over a varlen batch with state slots.

Per value head, with state S [dk, dv] and log decay g <= 0:
    S <- exp(g_t) S;  delta = beta_t (v_t - S^T k_t);  S <- S + k_t delta^T;  o_t = S^T q_t
with q, k L2-normalised (eps 1e-6) and q scaled by dk^-0.5; value head h reads key head
h // (Hv / Hk) (grouped value heads).

Upstream: flash-linear-attention (MIT, Songlin Yang, Yu Zhang) `fla/ops/gated_delta_rule`,
as vendored by vLLM 0.33 in vllm/third_party/flash_linear_attention/ops/fused_recurrent.py
(fused_recurrent_gated_delta_rule: one program per (value block, sequence, head), the state
tile kept in registers across the tokens, `ssm_state_indices` into a state pool) and
chunk.py; the chunked torch form follows transformers' torch_chunk_gated_delta_rule
(WY / UT transform, chunk 64). Own code. State layout is vLLM's [slots, Hv, dv, dk]
(transformers and upstream FLA use [.., dk, dv]).

- chunk_gated_delta_rule_torch: one sequence, chunked (prefill on the CPU path).
- recurrent_gated_delta_rule_torch: per-token recurrence (decode on CPU; the test oracle).
- fused_recurrent_gated_delta_rule: the Triton kernel (prefill and decode on CUDA);
  fused_sigmoid_gating_delta_rule: the same with the gates computed in the kernel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from libvllm.kernels._common import cdiv, check, next_pow2, pdl_launch, pdl_wait
from libvllm.kernels.launch_cache import cached_launch

L2_EPS = 1e-6


def _prep(q: torch.Tensor, k: torch.Tensor, num_v_heads: int, l2norm: bool
          ) -> tuple[torch.Tensor, torch.Tensor]:
    # q, k: [B, T, Hk, dk] -> fp32 [B, Hv, T, dk] (grouped value heads), q scaled
    r = num_v_heads // q.shape[2]
    q, k = (x.float().repeat_interleave(r, dim=2).transpose(1, 2) for x in (q, k))
    if l2norm:
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + L2_EPS)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + L2_EPS)
    return q * q.shape[-1] ** -0.5, k


def recurrent_gated_delta_rule_torch(q, k, v, g, beta, initial_state=None, l2norm=True):
    """q, k: [B, T, Hk, dk]; v: [B, T, Hv, dv]; g, beta: [B, T, Hv]; initial_state:
    [B, Hv, dv, dk] or None -> (o [B, T, Hv, dv] in v's dtype, final state fp32)."""
    B, T, Hv, dv = v.shape
    q, k = _prep(q, k, Hv, l2norm)
    vf, gf, bf = v.float().transpose(1, 2), g.float().transpose(1, 2), beta.float().transpose(1, 2)
    S = torch.zeros(B, Hv, dv, q.shape[-1], device=v.device) if initial_state is None \
        else initial_state.float().clone()  # [B, Hv, dv, dk]
    out = torch.empty(B, Hv, T, dv, device=v.device)
    for t in range(T):
        S = S * gf[:, :, t, None, None].exp()
        delta = (vf[:, :, t] - (S @ k[:, :, t, :, None])[..., 0]) * bf[:, :, t, None]
        S = S + delta[..., None] * k[:, :, t, None, :]
        out[:, :, t] = (S @ q[:, :, t, :, None])[..., 0]
    return out.transpose(1, 2).to(v.dtype), S


def chunk_gated_delta_rule_torch(q, k, v, g, beta, initial_state=None, l2norm=True,
                                 chunk_size: int = 64):
    """Same contract as recurrent_gated_delta_rule_torch, computed chunk by chunk."""
    B, T, Hv, dv = v.shape
    q, k = _prep(q, k, Hv, l2norm)  # [B, Hv, T, dk]
    vf, gf, bf = v.float().transpose(1, 2), g.float().transpose(1, 2), beta.float().transpose(1, 2)
    pad = (-T) % chunk_size
    q, k, vf = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, vf))
    gf, bf = F.pad(gf, (0, pad)), F.pad(bf, (0, pad))
    C = chunk_size
    q, k, vf = (x.unflatten(2, (-1, C)) for x in (q, k, vf))  # [B, Hv, n, C, d]
    gc = gf.unflatten(2, (-1, C)).cumsum(-1)  # [B, Hv, n, C] cumulative log decay
    bc = bf.unflatten(2, (-1, C))[..., None]
    future = torch.ones(C, C, dtype=torch.bool, device=v.device).triu(1)
    decay = (gc[..., :, None] - gc[..., None, :]).masked_fill(future, float("-inf")).exp()
    kk = ((k * bc) @ k.transpose(-1, -2)) * decay  # [B, Hv, n, C, C]
    qk = ((q @ k.transpose(-1, -2)) * decay).masked_fill(future, 0.0)
    # (I + strictly_lower(kk)) X = rhs: the WY representation of the chunk's updates
    A = kk.masked_fill(~torch.ones(C, C, dtype=torch.bool, device=v.device).tril(-1), 0.0) \
        + torch.eye(C, device=v.device)
    u = torch.linalg.solve_triangular(A, vf * bc, upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(A, k * bc * gc.exp()[..., None], upper=False,
                                      unitriangular=True)
    S = torch.zeros(B, Hv, q.shape[-1], dv, device=v.device) if initial_state is None \
        else initial_state.float().transpose(-1, -2).clone()  # [B, Hv, dk, dv]
    qd = q * gc.exp()[..., None]
    kd = k * (gc[..., -1:] - gc).exp()[..., None]
    out = torch.empty_like(vf)
    for i in range(q.shape[2]):
        v_new = u[:, :, i] - w[:, :, i] @ S  # [B, Hv, C, dv]
        out[:, :, i] = qd[:, :, i] @ S + qk[:, :, i] @ v_new
        S = S * gc[:, :, i, -1, None, None].exp() + kd[:, :, i].transpose(-1, -2) @ v_new
    out = out.flatten(2, 3)[:, :, :T]
    return out.transpose(1, 2).to(v.dtype), S.transpose(-1, -2)


def gated_delta_rule_varlen_torch(q, k, v, g, beta, ssm_states: torch.Tensor,
                                  query_start_loc: list[int], state_indices: list[int],
                                  has_initial_state: list[bool], l2norm: bool = True
                                  ) -> torch.Tensor:
    """The torch path of fused_recurrent_gated_delta_rule (same contract, host lists):
    a batch of single tokens runs the recurrence batched, longer rows the chunked form."""
    o = torch.zeros_like(v)
    live = [i for i, s in enumerate(state_indices) if s >= 0
            and query_start_loc[i + 1] > query_start_loc[i]]
    if not live:
        return o
    if all(query_start_loc[i + 1] - query_start_loc[i] == 1 for i in live):
        tok = torch.tensor([query_start_loc[i] for i in live], device=v.device)
        slots = torch.tensor([state_indices[i] for i in live], device=v.device)
        init = torch.tensor([has_initial_state[i] for i in live], device=v.device)
        s0 = ssm_states[slots].float() * init[:, None, None, None]
        out, s1 = recurrent_gated_delta_rule_torch(
            q[tok, None], k[tok, None], v[tok, None], g[tok, None], beta[tok, None], s0, l2norm)
        o[tok] = out[:, 0]
        ssm_states[slots] = s1.to(ssm_states.dtype)
        return o
    for i in live:
        a, b, slot = query_start_loc[i], query_start_loc[i + 1], state_indices[i]
        s0 = ssm_states[slot, None] if has_initial_state[i] else None
        out, s1 = chunk_gated_delta_rule_torch(q[None, a:b], k[None, a:b], v[None, a:b],
                                               g[None, a:b], beta[None, a:b], s0, l2norm)
        o[a:b] = out[0]
        ssm_states[slot] = s1[0].to(ssm_states.dtype)
    return o


@triton.jit
def gdn_gates(a, b, alog_ptr, dtb_ptr, hv):
    """Raw projections a, b (fp32) of value head hv -> (g, beta): g = -exp(A_log) *
    softplus(a + dt_bias) (the log decay), beta = sigmoid(b); softplus is linear past 20."""
    x = a + tl.load(dtb_ptr + hv).to(tl.float32)
    softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))
    return -tl.exp(tl.load(alog_ptr + hv).to(tl.float32)) * softplus, tl.sigmoid(b)


@cached_launch
@triton.jit(do_not_specialize=["num_seqs", "num_tokens"])  # one variant for every batch
def _fused_recurrent_kernel(q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, o_ptr, s_ptr, qsl_ptr, idx_ptr,
                            init_ptr, alog_ptr, dtb_ptr, scale, num_seqs, num_tokens, stride_q,
                            stride_k, stride_v, stride_o, stride_g, stride_b,
                            stride_s: tl.int64, GATING: tl.constexpr, HK: tl.constexpr,
                            HV: tl.constexpr,
                            DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr,
                            BV: tl.constexpr, L2NORM: tl.constexpr, ZERO_FILL: tl.constexpr,
                            USE_PDL: tl.constexpr):
    if USE_PDL:  # the kernel before wrote this one's inputs
        pdl_wait()
    i_v = tl.program_id(0)
    i_nh = tl.program_id(1)
    n = i_nh // HV
    hv = i_nh % HV
    hk = hv // (HV // HK)
    bos = tl.load(qsl_ptr + n).to(tl.int64)  # int offsets: the loop variable inherits it
    end = tl.load(qsl_ptr + n + 1).to(tl.int64)
    slot = tl.load(idx_ptr + n).to(tl.int64)
    eos = tl.where(slot >= 0, end, bos)  # padding rows do nothing
    ok = tl.arange(0, BK)
    ov = i_v * BV + tl.arange(0, BV)
    mk = ok < DK
    mv = ov < DV
    s_off = s_ptr + slot * stride_s + hv * DV * DK + ov[:, None] * DK + ok[None, :]
    # scalar conditions folded into vector bounds (the interpreter rejects scalar masks)
    dv_init = tl.where((tl.load(init_ptr + n).to(tl.int32) != 0) & (slot >= 0), DV, 0)
    h = tl.load(s_off, mask=(ov < dv_init)[:, None] & mk[None, :], other=0.0).to(tl.float32)
    for t in range(bos, eos):
        bq = tl.load(q_ptr + t * stride_q + hk * DK + ok, mask=mk, other=0.0).to(tl.float32)
        bk = tl.load(k_ptr + t * stride_k + hk * DK + ok, mask=mk, other=0.0).to(tl.float32)
        bv = tl.load(v_ptr + t * stride_v + hv * DV + ov, mask=mv, other=0.0).to(tl.float32)
        if L2NORM:
            bq = bq / tl.sqrt(tl.sum(bq * bq) + 1e-6)
            bk = bk / tl.sqrt(tl.sum(bk * bk) + 1e-6)
        bq = bq * scale
        bg = tl.load(g_ptr + t * stride_g + hv).to(tl.float32)
        bb = tl.load(b_ptr + t * stride_b + hv).to(tl.float32)
        if GATING:  # raw a, b
            bg, bb = gdn_gates(bg, bb, alog_ptr, dtb_ptr, hv)
        h = h * tl.exp(bg)
        bv = (bv - tl.sum(h * bk[None, :], 1)) * bb
        h = h + bv[:, None] * bk[None, :]
        bo = tl.sum(h * bq[None, :], 1)
        tl.store(o_ptr + t * stride_o + hv * DV + ov, bo.to(o_ptr.dtype.element_ty), mask=mv)
    dv_out = tl.where(eos > bos, DV, 0)  # [BV, BK] state tile written back
    tl.store(s_off, h.to(s_ptr.dtype.element_ty), mask=(ov < dv_out)[:, None] & mk[None, :])
    if ZERO_FILL:  # o is uninitialised: a skipped row's tokens, and the last row the tail
        zero_end = tl.where(n == num_seqs - 1, num_tokens, end)
        zeros = tl.zeros([BV], dtype=o_ptr.dtype.element_ty)
        for t in range(eos, zero_end):
            tl.store(o_ptr + t * stride_o + hv * DV + ov, zeros, mask=mv)


def fused_recurrent_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                     g: torch.Tensor, beta: torch.Tensor,
                                     ssm_states: torch.Tensor, query_start_loc: torch.Tensor,
                                     state_indices: torch.Tensor,
                                     has_initial_state: torch.Tensor,
                                     l2norm: bool = True,
                                     out: torch.Tensor | None = None) -> torch.Tensor:
    """q, k: [T, Hk, dk]; v: [T, Hv, dv]; g, beta: [T, Hv]; ssm_states: [slots, Hv, dv, dk]
    read (rows with an initial state) and written in place; query_start_loc: [N+1] int32;
    state_indices: [N] (negative: skip); has_initial_state: [N] bool -> o [T, Hv, dv] in
    v's dtype: zeros on skipped rows and past query_start_loc[N], or `out` (contiguous
    like v) written on the computed rows only."""
    return _launch(q, k, v, g, beta, None, None, ssm_states, query_start_loc, state_indices,
                   has_initial_state, l2norm, out)


def fused_sigmoid_gating_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
                                    dt_bias: torch.Tensor, ssm_states: torch.Tensor,
                                    query_start_loc: torch.Tensor, state_indices: torch.Tensor,
                                    has_initial_state: torch.Tensor,
                                    out: torch.Tensor | None = None) -> torch.Tensor:
    """fused_recurrent_gated_delta_rule with the gates computed in the kernel from the raw
    projections a, b ([T, Hv], rows may be strided) and A_log, dt_bias ([Hv], any float
    dtype, read as fp32): vLLM's fused_sigmoid_gating_delta_rule_update
    (third_party/.../fused_sigmoid_gating.py)."""
    check_sigmoid_gates(A_log, dt_bias, v.shape[1])
    return _launch(q, k, v, a, b, A_log, dt_bias, ssm_states, query_start_loc, state_indices,
                   has_initial_state, True, out)


def check_sigmoid_gates(A_log: torch.Tensor, dt_bias: torch.Tensor, HV: int) -> None:
    """A_log and dt_bias of the in-kernel gates: contiguous [Hv]."""
    check(A_log.shape == (HV,) and dt_bias.shape == (HV,) and A_log.is_contiguous()
          and dt_bias.is_contiguous(), lambda: f"A_log and dt_bias must be contiguous [{HV}]")


def check_gdn_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                     beta: torch.Tensor, ssm_states: torch.Tensor) -> None:
    """The layouts both GDN kernels (this recurrent one, kernels/chunk_gated_delta_rule.py)
    take: q, k [T, Hk, dk] and v [T, Hv, dv] with contiguous heads, Hv a multiple of Hk,
    ssm_states [slots, Hv, dv, dk] contiguous within a slot (any slot stride: the state
    may be a view of a block pool), gates with contiguous rows."""
    HK, DK = k.shape[1:]
    HV, DV = v.shape[1:]
    check(HV % HK == 0, lambda: f"value heads {HV} must be a multiple of key heads {HK}")
    check(q.shape == k.shape and all(x.stride(-1) == 1 and x.stride(-2) == x.shape[-1]
                                     for x in (q, k, v)), "q/k/v need [T, H, d] with "
          "contiguous heads")
    check(ssm_states.shape[1:] == (HV, DV, DK) and ssm_states[0].is_contiguous(),
          lambda: f"ssm_states must be [slots, {HV}, {DV}, {DK}], contiguous in a slot")
    check(g.stride(-1) == 1 and beta.stride(-1) == 1, "gates need contiguous rows")


def _launch(q, k, v, g, beta, A_log, dt_bias, ssm_states, query_start_loc, state_indices,
            has_initial_state, l2norm: bool, out) -> torch.Tensor:
    T, HK, DK = k.shape
    HV, DV = v.shape[1:]
    N = state_indices.shape[0]
    check_gdn_inputs(q, k, v, g, beta, ssm_states)
    check(has_initial_state.shape == (N,), lambda: f"has_initial_state must be [{N}]")
    if out is not None:
        check(out.shape == v.shape and out.dtype == v.dtype and out.is_contiguous(),
              "out must be contiguous like v")
    o = torch.empty(T, HV, DV, dtype=v.dtype, device=v.device) if out is None else out
    if T == 0:
        return o
    if N == 0:
        return o.zero_() if out is None else o
    BK = next_pow2(DK)
    BV = min(32, next_pow2(DV))
    gating = A_log is not None
    _fused_recurrent_kernel[(cdiv(DV, BV), N * HV)](
        q, k, v, g, beta, o, ssm_states, query_start_loc, state_indices, has_initial_state,
        A_log if gating else g, dt_bias if gating else g, DK ** -0.5, N, T, q.stride(0),
        k.stride(0), v.stride(0), o.stride(0), g.stride(0), beta.stride(0),
        ssm_states.stride(0), GATING=gating,
        HK=HK, HV=HV, DK=DK, DV=DV, BK=BK, BV=BV, L2NORM=l2norm, ZERO_FILL=out is None,
        **pdl_launch(v))
    return o
