"""Depthwise causal conv1d with a per-request conv state, for varlen prefill and decode.

Mirrors vllm/model_executor/layers/mamba/ops/causal_conv1d.py (causal_conv1d_fn for varlen
prefill with `conv_states`, `cache_indices`, `has_initial_state`; causal_conv1d_update for
one token per request), itself adapted from Dao-AILab/causal-conv1d; own code. Layouts:
x is token-major [num_tokens, dim] (one flat batch, sequences delimited by
query_start_loc); the conv state is vLLM's "SD" layout [num_slots, K - 1, dim] holding the
last K - 1 inputs of a request; weight is [dim, K]. Rows whose state index is negative
(padding) are skipped. SiLU is applied when `activation` (Qwen3-Next / Qwen3.5 use it).

causal_conv1d_ref is the torch path (CPU) and the Triton kernels' test oracle. The Triton
kernel computes the outputs reading the old states; when one time block covers every
sequence (decode, vLLM's causal_conv1d_update) the same program then writes the new states,
else a second kernel does. x may be a strided view (the in-projection's [q | k | v] part):
no copy.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from libvllm.kernels._common import cdiv, check, next_pow2, pdl_launch, pdl_wait
from libvllm.kernels.launch_cache import cached_launch


def causal_conv1d_ref(x: torch.Tensor, weight: torch.Tensor, conv_states: torch.Tensor,
                      query_start_loc: list[int], state_indices: list[int],
                      has_initial_state: list[bool], activation: bool = True) -> torch.Tensor:
    """x: [T, dim]; weight: [dim, K]; conv_states: [slots, K-1, dim] (updated in place)
    -> out [T, dim] in x's dtype."""
    K = weight.shape[1]
    out = torch.empty_like(x)
    w = weight.float().t()  # [K, dim]
    for i, slot in enumerate(state_indices):
        s, e = query_start_loc[i], query_start_loc[i + 1]
        if slot < 0 or e == s:
            continue
        init = conv_states[slot].float() if has_initial_state[i] else \
            x.new_zeros(K - 1, x.shape[1], dtype=torch.float32)
        xs = torch.cat([init, x[s:e].float()])  # [K-1+L, dim]
        y = (xs.unfold(0, K, 1) * w.t()).sum(-1)  # windows [L, dim, K] -> [L, dim]
        out[s:e] = (F.silu(y) if activation else y).to(x.dtype)
        conv_states[slot] = xs[-(K - 1):].to(conv_states.dtype)
    return out


@triton.jit
def _new_state_tile(x_ptr, state_ptr, bos, seqlen, slot, has_init, c, mc, stride_x,
                    stride_s_slot, stride_s_k, K: tl.constexpr, BLOCK_K: tl.constexpr):
    """A request's new conv state for channels c: the last K - 1 inputs of the old state
    followed by the sequence -> (values [BLOCK_K, BLOCK_C] fp32, store pointers, mask)."""
    j = tl.arange(0, BLOCK_K)  # [BLOCK_K] row of the new state
    mj = (j < K - 1) & (j < (K - 1) * seqlen)  # nothing to write for an empty row
    src = seqlen - (K - 1) + j  # the input it keeps (negative: a row of the old state)
    xm = (mj & (src >= 0))[:, None] & mc[None, :]
    xv = tl.load(x_ptr + (bos + src).to(tl.int64)[:, None] * stride_x + c[None, :], mask=xm,
                 other=0.0)
    sm = (mj & (src < 0) & (src >= 1 - K * has_init))[:, None] & mc[None, :]
    sv = tl.load(state_ptr + slot * stride_s_slot + (K - 1 + src)[:, None] * stride_s_k
                 + c[None, :], mask=sm, other=0.0)
    ptrs = state_ptr + slot * stride_s_slot + j[:, None] * stride_s_k + c[None, :]
    return xv.to(tl.float32) + sv.to(tl.float32), ptrs, mj[:, None] & mc[None, :]


@cached_launch
@triton.jit
def _conv_fwd_kernel(x_ptr, w_ptr, state_ptr, out_ptr, qsl_ptr, idx_ptr, init_ptr,
                     dim, stride_x, stride_o, stride_s_slot, stride_s_k,
                     K: tl.constexpr, ACT: tl.constexpr, BLOCK_T: tl.constexpr,
                     BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr, WRITE_STATE: tl.constexpr,
                     USE_PDL: tl.constexpr):
    # WRITE_STATE: one time block covers every sequence, so this program also writes the
    # new state of its channels (decode: one launch, not two)
    if USE_PDL:  # the kernel before wrote this one's inputs
        pdl_wait()
    n = tl.program_id(0)
    bos = tl.load(qsl_ptr + n)
    seqlen = tl.load(qsl_ptr + n + 1) - bos
    slot = tl.load(idx_ptr + n).to(tl.int64)
    has_init = tl.load(init_ptr + n).to(tl.int32)  # 0 / 1
    seqlen = tl.where(slot >= 0, seqlen, 0)  # padding rows do nothing
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)  # [BLOCK_T] position in the sequence
    c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)  # [BLOCK_C] channel
    mt = t < seqlen
    mc = c < dim
    acc = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    for k in tl.static_range(K):
        src = t - (K - 1) + k  # input position read by tap k (negative: the conv state)
        xm = (mt & (src >= 0))[:, None] & mc[None, :]
        xv = tl.load(x_ptr + (bos + src).to(tl.int64)[:, None] * stride_x + c[None, :],
                     mask=xm, other=0.0).to(tl.float32)
        sm = (mt & (src < 0) & (src >= 1 - K * has_init))[:, None] & mc[None, :]
        sv = tl.load(state_ptr + slot * stride_s_slot + (K - 1 + src)[:, None] * stride_s_k
                     + c[None, :], mask=sm, other=0.0).to(tl.float32)
        wk = tl.load(w_ptr + c * K + k, mask=mc, other=0.0).to(tl.float32)
        acc += (xv + sv) * wk[None, :]
    if ACT:
        acc = acc * tl.sigmoid(acc)
    om = mt[:, None] & mc[None, :]
    tl.store(out_ptr + (bos + t).to(tl.int64)[:, None] * stride_o + c[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=om)
    if WRITE_STATE:
        new, ptrs, m = _new_state_tile(x_ptr, state_ptr, bos, seqlen, slot, has_init, c, mc,
                                       stride_x, stride_s_slot, stride_s_k, K, BLOCK_K)
        tl.debug_barrier()  # every thread's state reads before any thread's writes
        tl.store(ptrs, new.to(state_ptr.dtype.element_ty), mask=m)


@cached_launch
@triton.jit
def _conv_state_kernel(x_ptr, state_ptr, qsl_ptr, idx_ptr, init_ptr, dim, stride_x,
                       stride_s_slot, stride_s_k, K: tl.constexpr, BLOCK_K: tl.constexpr,
                       BLOCK_C: tl.constexpr):
    n = tl.program_id(0)
    bos = tl.load(qsl_ptr + n)
    seqlen = tl.load(qsl_ptr + n + 1) - bos
    slot = tl.load(idx_ptr + n).to(tl.int64)
    has_init = tl.load(init_ptr + n).to(tl.int32)  # 0 / 1
    seqlen = tl.where(slot >= 0, seqlen, 0)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    new, ptrs, m = _new_state_tile(x_ptr, state_ptr, bos, seqlen, slot, has_init, c, c < dim,
                                   stride_x, stride_s_slot, stride_s_k, K, BLOCK_K)
    tl.debug_barrier()  # every thread's state reads before any thread's writes
    tl.store(ptrs, new.to(state_ptr.dtype.element_ty), mask=m)


def causal_conv1d_fn(x: torch.Tensor, weight: torch.Tensor, conv_states: torch.Tensor,
                     query_start_loc: torch.Tensor, state_indices: torch.Tensor,
                     has_initial_state: torch.Tensor, max_query_len: int,
                     activation: bool = True) -> torch.Tensor:
    """Triton varlen conv (prefill chunks and decode alike). x: [T, dim] (rows contiguous,
    any row stride: a view of the in-projection's output); weight: [dim, K]; conv_states:
    [slots, K-1, dim] updated in place; query_start_loc: [N+1] int32; state_indices: [N]
    int (negative: skip); has_initial_state: [N] bool. Steps whose rows all fit one time
    block (max_query_len <= 64: decode) take one launch, longer ones two."""
    T, dim = x.shape
    K = weight.shape[1]
    N = state_indices.shape[0]
    check(x.stride(1) == 1 and conv_states.stride(2) == 1, "x and conv_states need "
          "contiguous rows")
    check(weight.shape[0] == dim and conv_states.shape[1:] == (K - 1, dim),
          lambda: f"shapes do not match: weight {tuple(weight.shape)}, conv_states "
          f"{tuple(conv_states.shape)}, dim {dim}")
    check(query_start_loc.shape == (N + 1,) and has_initial_state.shape == (N,),
          lambda: f"query_start_loc must be [{N + 1}] and has_initial_state [{N}] for "
          f"{N} state indices, got {tuple(query_start_loc.shape)} and "
          f"{tuple(has_initial_state.shape)}")
    out = torch.empty(T, dim, dtype=x.dtype, device=x.device)
    if N == 0 or T == 0:
        return out
    weight = weight.contiguous()
    block_c = min(128, next_pow2(dim))
    block_t = min(64, next_pow2(max(max_query_len, 1)))
    block_k = next_pow2(max(K - 1, 1))
    t_blocks = cdiv(max(max_query_len, 1), block_t)
    one = t_blocks == 1
    _conv_fwd_kernel[(N, t_blocks, cdiv(dim, block_c))](
        x, weight, conv_states, out, query_start_loc, state_indices, has_initial_state, dim,
        x.stride(0), out.stride(0), conv_states.stride(0), conv_states.stride(1), K=K,
        ACT=activation, BLOCK_T=block_t, BLOCK_C=block_c, BLOCK_K=block_k, WRITE_STATE=one,
        **pdl_launch(x))
    if not one:
        _conv_state_kernel[(N, cdiv(dim, block_c))](
            x, conv_states, query_start_loc, state_indices, has_initial_state, dim,
            x.stride(0), conv_states.stride(0), conv_states.stride(1), K=K, BLOCK_K=block_k,
            BLOCK_C=block_c)
    return out
