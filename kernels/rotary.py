"""Rotary position embedding (NeoX rotate-half) applied in place to q and k, in Triton.

Mirrors vllm/model_executor/layers/rotary_embedding/base.py (RotaryEmbedding.forward_cuda ->
ops.rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox=True), CUDA op
csrc/pos_encoding_kernels.cu). One program per token rotates the first `rotary_dim` features
of every q and k head; the rest of each head is left untouched. cos/sin come from the
engine's fp32 cache [max_position, rotary_dim] (cos half, then sin half), products are fp32
and rounded once, as engine/layers/rotary_embedding.py does.

Precondition: 0 <= positions < cos_sin_cache.shape[0]; the scheduler bounds positions by
max_model_len (checking here would need a host sync inside the step).
rotary_embedding_ref is the engine's RotaryEmbedding.forward_native in plain torch;
tests/test_kernels_rotary.py checks they agree.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from libvllm.kernels._common import (
    check,
    check_float,
    check_same_device,
    next_pow2,
    pdl_launch,
    pdl_wait,
)
from libvllm.kernels.launch_cache import cached_launch


@triton.jit
def _rotate_heads(ptr, stride_h, n_heads, cos, sin, half,
                  BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    # ptr: first element of this token's heads; rotates [n_heads, rotary_dim] in place (all
    # loads before the barrier: a small tile is held by several threads)
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < n_heads) & (d < half)
    p1 = ptr + h * stride_h + d
    x1 = tl.load(p1, mask=mask, other=0.0)
    x2 = tl.load(p1 + half, mask=mask, other=0.0)
    tl.debug_barrier()
    f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
    tl.store(p1, (f1 * cos - f2 * sin).to(x1.dtype), mask=mask)
    tl.store(p1 + half, (f2 * cos + f1 * sin).to(x1.dtype), mask=mask)


@cached_launch
@triton.jit
def _rotary_embedding_kernel(
    pos_ptr, q_ptr, k_ptr, cache_ptr, stride_qt, stride_qh, stride_kt, stride_kh,
    n_q_heads, n_k_heads, half, stride_cache,
    BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_D: tl.constexpr, USE_PDL: tl.constexpr,
):
    if USE_PDL:  # the kernel before wrote this one's inputs
        pdl_wait()
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    d = tl.arange(0, BLOCK_D)[None, :]
    cos = tl.load(cache_ptr + pos * stride_cache + d, mask=d < half, other=0.0)  # [1, BLOCK_D]
    sin = tl.load(cache_ptr + pos * stride_cache + half + d, mask=d < half, other=0.0)
    _rotate_heads(q_ptr + tok * stride_qt, stride_qh, n_q_heads, cos, sin, half, BLOCK_HQ, BLOCK_D)
    _rotate_heads(k_ptr + tok * stride_kt, stride_kh, n_k_heads, cos, sin, half, BLOCK_HK, BLOCK_D)


def _check_positions(positions: torch.Tensor) -> int:
    """The token count T of positions [T] (int32/int64)."""
    check(positions.dim() == 1 and positions.dtype in (torch.int32, torch.int64),
          "positions must be a 1-D int32/int64 tensor")
    return positions.shape[0]


def _check_cos_sin_cache(cos_sin_cache: torch.Tensor, head_size: int) -> int:
    """rotary_dim of cos_sin_cache [max_position, rotary_dim] float32."""
    check(cos_sin_cache.dim() == 2 and cos_sin_cache.stride(1) == 1
          and cos_sin_cache.dtype == torch.float32, "cos_sin_cache must be [max_position, "
          "rotary_dim] float32 with a contiguous last dimension")
    rot = cos_sin_cache.shape[1]
    check(rot % 2 == 0 and 0 < rot <= head_size, lambda: f"rotary_dim {rot} must be even and <= "
          f"head_size {head_size}")
    return rot


def _heads_view(name: str, t: torch.Tensor, n: int, head_size: int) -> tuple[int, int, int]:
    """(n_heads, token stride, head stride) of a [n, heads * hs] or [n, heads, hs] tensor."""
    check_float(name, t)
    if t.dim() == 2:
        check(t.shape[0] == n and t.shape[1] % head_size == 0 and t.stride(1) == 1,
              lambda: f"{name} must be [{n}, heads * {head_size}] with a contiguous last "
              "dimension, "
              f"got {tuple(t.shape)}")
        return t.shape[1] // head_size, t.stride(0), head_size
    check(t.dim() == 3 and t.shape[0] == n and t.shape[2] == head_size and t.stride(2) == 1,
          lambda: f"{name} must be [{n}, heads, {head_size}], got {tuple(t.shape)}")
    return t.shape[1], t.stride(0), t.stride(1)


def rotary_embedding(
    positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
    cos_sin_cache: torch.Tensor, head_size: int,
) -> None:
    """In place: rotate q [T, nq * hs] and k [T, nkv * hs] by positions [T] (neox style).

    cos_sin_cache: [max_position, rotary_dim] float32, cos then sin halves.
    """
    n = _check_positions(positions)
    nq, sqt, sqh = _heads_view("query", query, n, head_size)
    nk, skt, skh = _heads_view("key", key, n, head_size)
    rot = _check_cos_sin_cache(cos_sin_cache, head_size)
    check_same_device(positions=positions, query=query, key=key, cos_sin_cache=cos_sin_cache)
    if n == 0:
        return
    _rotary_embedding_kernel[(n,)](
        positions, query, key, cos_sin_cache, sqt, sqh, skt, skh, nq, nk, rot // 2,
        cos_sin_cache.stride(0), BLOCK_HQ=next_pow2(nq),
        BLOCK_HK=next_pow2(nk), BLOCK_D=next_pow2(rot // 2),
        num_warps=4,
        **pdl_launch(query),
    )


def rotary_embedding_ref(
    positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
    cos_sin_cache: torch.Tensor, head_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The engine's RotaryEmbedding.forward_native (engine/layers/rotary_embedding.py) with
    the given table, out of place: [T, nq * hs], [T, nkv * hs]. The first rotary_dim
    features of each head are rotated in fp32 and rounded once; the rest pass through."""
    n, rot = positions.shape[0], cos_sin_cache.shape[1]
    table = cos_sin_cache.to(positions.device)[positions].unsqueeze(1)  # [T, 1, rot]
    cos, sin = table.chunk(2, dim=-1)  # [T, 1, rot / 2] each

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(n, -1, head_size)  # [T, heads, hs]
        x1, x2 = x[..., :rot].float().chunk(2, dim=-1)
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)
        return torch.cat((out, x[..., rot:]), dim=-1).reshape(n, -1)

    return rotate(query), rotate(key)
