"""kernels/rotary_cache.py (RoPE fused with the KV-cache write) against the unfused pair.

Oracle: rotary_embedding_and_cache_ref = the engine's RotaryEmbedding.forward_native, then
its reshape_and_cache with padding slots skipped. Cases from vLLM 0.33
tests/kernels/core/test_pos_encoding.py (head sizes, partial rotary_dim, q/k as views of a
fused qkv tensor, random positions) and tests/kernels/attention/test_cache.py (random
slots, PAD_SLOT_ID rows). The QK_NORM variant (Qwen3's per-head q/k RMSNorm folded in)
against RMSNorm.forward_native over each head, then the same unfused pair, as vLLM 0.33
tests/kernels/core/test_fused_qk_norm_rope.py (_apply_qk_norm_rope: q/k views of a fused
qkv, partial rotary ratios, GQA) and its fused_qknorm_rope_cache_kernel.cu cache write.
"""

from __future__ import annotations

import pytest
import torch
from test_kernels_common import DEVICE, DTYPES, assert_close, gpu

from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.layers.attention import Attention, AttentionMetadata
from libvllm.engine.layers.layernorm import GemmaRMSNorm, RMSNorm
from libvllm.engine.layers.rotary_embedding import RotaryEmbedding
from libvllm.kernels.rotary_cache import rotary_embedding_and_cache, rotary_embedding_and_cache_ref


@pytest.mark.parametrize("nq,nkv", [(4, 4), (8, 2), (5, 1)])
@pytest.mark.parametrize("hs,rot", [(32, 32), (64, 32), (40, 40)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_and_cache_matches_unfused(nq, nkv, hs, rot, dtype) -> None:
    torch.manual_seed(0)
    n, num_blocks, bs = 5, 6, 4
    table = RotaryEmbedding(hs, rot, 4096, 10000.0).cos_sin_cache.to(DEVICE)
    positions = torch.randint(0, 4096, (n,), device=DEVICE)
    qkv = torch.randn(n, (nq + 2 * nkv) * hs, dtype=dtype, device=DEVICE)
    q, k, v = qkv.split([nq * hs, nkv * hs, nkv * hs], dim=-1)  # strided row views
    slots = torch.randperm(num_blocks * bs, device=DEVICE)[:n]
    slots[2] = -1  # a padding row: rotated q, no cache write
    cache = torch.randn(2, num_blocks, bs, nkv, hs, dtype=dtype, device=DEVICE)
    want_cache = cache.clone()
    want_q = rotary_embedding_and_cache_ref(positions, q.clone(), k, v, table, hs, want_cache,
                                            slots)
    k_before = k.clone()
    rotary_embedding_and_cache(positions, q, k, v, table, hs, cache, slots)
    assert_close(q, want_q)
    assert_close(cache, want_cache)
    assert torch.equal(k, k_before)  # keys live in the cache only


# fp16 / bf16: a reduction order or rsqrt that differs from torch's may move a normalized
# value (|x| < 8 here) by one ulp before the rotation, which can cancel: 2 ulps of 8 absolute
HALF_ATOL = {torch.float16: 2 * 8 * 2**-11, torch.bfloat16: 2 * 8 * 2**-8}


def _check_qk_norm_case(n, nq, nkv, hs, rot, dtype, weight_offset=0.0):
    torch.manual_seed(0)
    atol = HALF_ATOL.get(dtype)
    num_blocks, bs, eps = 2 * n, 4, 1e-6
    table = RotaryEmbedding(hs, rot, 4096, 10000.0).cos_sin_cache.to(DEVICE)
    positions = torch.randint(0, 4096, (n,), device=DEVICE)
    qkv = torch.randn(n, (nq + 2 * nkv) * hs, dtype=dtype, device=DEVICE) * 3
    q, k, v = qkv.split([nq * hs, nkv * hs, nkv * hs], dim=-1)  # strided row views
    qw = torch.rand(hs, dtype=dtype, device=DEVICE) + 0.5
    kw = torch.rand(hs, dtype=dtype, device=DEVICE) - 0.5
    slots = torch.randperm(num_blocks * bs, device=DEVICE)[:n]
    slots[n // 2] = -1  # a padding row: normalized, rotated q, no cache write
    cache = torch.randn(2, num_blocks, bs, nkv, hs, dtype=dtype, device=DEVICE)
    want_cache = cache.clone()
    want_q = rotary_embedding_and_cache_ref(positions, q.clone(), k, v, table, hs, want_cache,
                                            slots, qw, kw, eps, weight_offset)
    k_before = k.clone()
    rotary_embedding_and_cache(positions, q, k, v, table, hs, cache, slots, qw, kw, eps,
                               weight_offset)
    assert_close(q, want_q, atol)
    assert_close(cache, want_cache, atol)
    assert torch.equal(k, k_before)  # keys live in the cache only


@pytest.mark.parametrize("nq,nkv", [(4, 4), (8, 2), (5, 1)])
@pytest.mark.parametrize("hs,rot", [(64, 64), (128, 128), (64, 32), (128, 32), (40, 40)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_qk_norm_rotary_and_cache_matches_unfused(nq, nkv, hs, rot, dtype) -> None:
    _check_qk_norm_case(5, nq, nkv, hs, rot, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_qk_norm_gemma_weight_offset(dtype) -> None:
    # GemmaRMSNorm's x * (1 + w): Gemma 3 and Qwen3-Next (partial rotary 1/4 of 256)
    _check_qk_norm_case(3, 4, 2, 128, 128, dtype, weight_offset=1.0)
    _check_qk_norm_case(3, 4, 1, 256, 64, dtype, weight_offset=1.0)


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_qk_norm_qwen3_moe_shapes_gpu(dtype) -> None:
    # Qwen3-30B-A3B: 32 q heads, 4 kv heads of 128; a 64-token decode batch and a prefill
    for n in (64, 300):
        _check_qk_norm_case(n, 32, 4, 128, 128, dtype)


@pytest.mark.parametrize("norm_cls,hs,rot", [(RMSNorm, 64, 64), (GemmaRMSNorm, 128, 32)])
def test_attention_layer_fuses_qk_norm(norm_cls, hs, rot) -> None:
    # the layer's kernel path (Attention._forward_cuda, interpreted on CPU) with the
    # (q_norm, k_norm) pair equals the two norms, then the layer without them
    torch.manual_seed(0)
    n, nq, nkv, bs = 6, 4, 2, 4
    rope = RotaryEmbedding(hs, rot, 64, 10000.0)
    q_norm, k_norm = norm_cls(hs, 1e-6).to(DEVICE), norm_cls(hs, 1e-6).to(DEVICE)
    q_norm.weight.data.uniform_(0.5, 1.5)
    k_norm.weight.data.uniform_(-0.5, 0.5)
    md = AttentionMetadata(n, torch.arange(bs, bs + n, device=DEVICE), [0, n], [n],
                           torch.tensor([[1, 2]], dtype=torch.int32, device=DEVICE),
                           torch.tensor([0, n], dtype=torch.int32, device=DEVICE),
                           torch.tensor([n], dtype=torch.int32, device=DEVICE), n, n)
    positions = torch.arange(n, device=DEVICE)
    qkv = torch.randn(n, (nq + 2 * nkv) * hs, device=DEVICE)
    outs, caches = [], []
    for fused in (False, True):
        attn = Attention(nq, hs, hs**-0.5, nkv)
        attn.kv_cache = torch.zeros(2, 4, bs, nkv, hs, device=DEVICE)
        q, k, v = qkv.clone().split([nq * hs, nkv * hs, nkv * hs], dim=-1)
        if fused:
            out = attn._forward_cuda(q.view(n, nq, hs), k.view(n, nkv, hs), v.view(n, nkv, hs),
                                     md, positions, rope, (q_norm, k_norm), None)
        else:
            q = q_norm(q.unflatten(-1, (nq, hs))).flatten(-2)
            k = k_norm(k.unflatten(-1, (nkv, hs))).flatten(-2)
            out = attn(q, k, v, md, positions, rope)
        outs.append(out)
        caches.append(attn.kv_cache)
    assert_close(outs[1], outs[0], atol=1e-4, rtol=1e-4)
    assert_close(caches[1], caches[0])


def _small_args() -> tuple[torch.Tensor, ...]:
    """(positions, q, k, cos_sin table, kv_cache, slots): 2 tokens, 4 q / 2 kv heads of 16."""
    return (torch.zeros(2, dtype=torch.int64, device=DEVICE), torch.zeros(2, 64, device=DEVICE),
            torch.zeros(2, 32, device=DEVICE), torch.zeros(8, 16, device=DEVICE),
            torch.zeros(2, 4, 4, 2, 16, device=DEVICE),
            torch.zeros(2, dtype=torch.int64, device=DEVICE))


def test_qk_norm_rejects_bad_weights() -> None:
    pos, q, k, table, cache, slots = _small_args()
    w = torch.ones(16, device=DEVICE)
    with pytest.raises(InvalidArgumentError, match="go together"):
        rotary_embedding_and_cache(pos, q, k, k, table, 16, cache, slots, w)
    with pytest.raises(InvalidArgumentError, match="k_weight must be \\[16\\]"):
        rotary_embedding_and_cache(pos, q, k, k, table, 16, cache, slots, w, w[:8])
    with pytest.raises(InvalidArgumentError, match="weight_offset must be 0 or 1"):
        rotary_embedding_and_cache(pos, q, k, k, table, 16, cache, slots, w, w,
                                   weight_offset=2.0)


def test_rotary_and_cache_rejects_bad_input() -> None:
    pos, q, k, table, cache, slots = _small_args()
    with pytest.raises(InvalidArgumentError, match="kv_cache must be"):
        rotary_embedding_and_cache(pos, q, k, k, table, 16, cache[:, :, :, :1], slots)
    with pytest.raises(InvalidArgumentError, match="slot_mapping must be"):
        rotary_embedding_and_cache(pos, q, k, k, table, 16, cache, slots[:1])
    with pytest.raises(InvalidArgumentError, match="positions must be"):
        rotary_embedding_and_cache(pos.float(), q, k, k, table, 16, cache, slots)
