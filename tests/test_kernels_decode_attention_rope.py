"""kernels/decode_attention.py with this step's RoPE and KV-cache write in the decode kernel.

Oracle: the unfused pair the engine ran before, kernels/rotary_cache.py's
rotary_embedding_and_cache_ref (RotaryEmbedding.forward_native, then reshape_and_cache with
padding slots skipped) and then paged_attention_decode_ref. Cases mirror vLLM 0.33
tests/kernels/attention/test_triton_decode_attention.py (split-KV counts, GQA) and
tests/kernels/core/test_pos_encoding.py (partial rotary_dim, q/k/v as views of a fused qkv
row), plus what the fusion adds: the new token's tile owned by the last KV split, a padding
row (seq_len 0, PAD_SLOT_ID -1) that writes nothing, sliding windows.
"""

from __future__ import annotations

import pytest
import torch
from test_kernels_common import DEVICE, ON_CUDA, assert_close, gpu

from engine.errors import InvalidArgumentError
from engine.layers.attention import Attention, AttentionMetadata
from engine.layers.rotary_embedding import RotaryEmbedding
from kernels.decode_attention import paged_attention_decode, paged_attention_decode_ref
from kernels.rotary_cache import rotary_embedding_and_cache_ref

TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


def _step(kv_lens, nq, nkv, hd, rot, bs, dtype, seed=0):
    """A decode step: q/k/v rows of a fused qkv, the cache, block table (distinct blocks per
    request), seq_lens (incl. the new token), positions, slots of the new tokens (-1 for a
    seq_len 0 padding row), cos/sin table."""
    torch.manual_seed(seed)
    n = len(kv_lens)
    max_blocks = max(1, max((k + bs - 1) // bs for k in kv_lens))
    num_blocks = n * max_blocks + 2
    bt = torch.randperm(num_blocks, device=DEVICE)[:n * max_blocks].view(n, max_blocks)
    bt = bt.to(torch.int32)
    qkv = torch.randn(n, (nq + 2 * nkv) * hd, dtype=dtype, device=DEVICE)
    q, k, v = qkv.split([nq * hd, nkv * hd, nkv * hd], dim=-1)
    cache = torch.randn(2, num_blocks, bs, nkv, hd, dtype=dtype, device=DEVICE)
    lens = torch.tensor(kv_lens, dtype=torch.int32, device=DEVICE)
    positions = (lens.long() - 1).clamp(min=0)
    slots = torch.tensor([int(bt[i, (L - 1) // bs]) * bs + (L - 1) % bs if L else -1
                          for i, L in enumerate(kv_lens)], device=DEVICE)
    table = RotaryEmbedding(hd, rot, 4096, 10000.0).cos_sin_cache.to(DEVICE)
    return q, k, v, cache, bt, lens, positions, slots, table


def _unfused(q, k, v, cache, bt, lens, positions, slots, table, hd, window):
    n = q.shape[0]
    q = rotary_embedding_and_cache_ref(positions, q.clone(), k, v, table, hd, cache, slots)
    return paged_attention_decode_ref(q.view(n, -1, hd), cache, bt, lens, hd**-0.5, window)


@pytest.mark.parametrize("kv_lens", [[13, 1, 40], [17, 0, 5]])
@pytest.mark.parametrize("nq,nkv", [(4, 4), (8, 2), (5, 1)])
@pytest.mark.parametrize("num_splits,window", [(1, None), (3, 6), (8, None)])
@pytest.mark.parametrize("hd,rot", [(32, 32), (32, 16)])
def test_decode_with_rope_equals_the_unfused_pair(kv_lens, nq, nkv, num_splits, window, hd,
                                                  rot) -> None:
    dtype = torch.bfloat16 if ON_CUDA else torch.float32
    q, k, v, cache, bt, lens, pos, slots, table = _step(kv_lens, nq, nkv, hd, rot, 4, dtype)
    want_cache = cache.clone()
    want = _unfused(q, k, v, want_cache, bt, lens, pos, slots, table, hd, window)
    q_before = q.clone()
    out = paged_attention_decode(q.view(len(kv_lens), nq, hd), cache, bt, lens, hd**-0.5,
                                 sliding_window=window, num_splits=num_splits, tile_n=16,
                                 positions=pos, key=k, value=v, cos_sin_cache=table,
                                 slot_mapping=slots)
    torch.testing.assert_close(out.float(), want.float(), atol=TOL[dtype], rtol=TOL[dtype])
    assert_close(cache, want_cache)  # the new k (rotated) and v at their slots, nothing else
    assert torch.equal(q, q_before)  # q is rotated in registers only


def test_new_token_is_attended_to() -> None:
    # a one-token context: the output is exactly the new v, so the kernel read back the
    # slot it wrote in the same launch
    q, k, v, cache, bt, lens, pos, slots, table = _step([1], 4, 2, 32, 32, 4, torch.float32)
    out = paged_attention_decode(q.view(1, 4, 32), cache, bt, lens, 32**-0.5, num_splits=4,
                                 tile_n=16, positions=pos, key=k, value=v,
                                 cos_sin_cache=table, slot_mapping=slots)
    want = v.view(1, 2, 32).repeat_interleave(2, dim=1)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)


def test_rope_arguments_go_together() -> None:
    q, k, v, cache, bt, lens, pos, slots, table = _step([3], 4, 2, 32, 32, 4, torch.float32)
    with pytest.raises(InvalidArgumentError, match="go together"):
        paged_attention_decode(q.view(1, 4, 32), cache, bt, lens, 0.1, positions=pos, key=k)
    with pytest.raises(InvalidArgumentError, match="slot_mapping"):
        paged_attention_decode(q.view(1, 4, 32), cache, bt, lens, 0.1, positions=pos, key=k,
                               value=v, cos_sin_cache=table, slot_mapping=slots[:0])


def test_attention_layer_decode_fuses_rope() -> None:
    # the layer's kernel path (Attention._forward_cuda, interpreted on CPU) for a decode
    # batch with rotary_emb equals the torch path, output and cache
    nq, nkv, hd, bs = 4, 2, 32, 4
    q, k, v, cache, bt, lens, pos, slots, _ = _step([6, 9], nq, nkv, hd, hd, bs,
                                                     torch.float32)
    rope = RotaryEmbedding(hd, hd, 64, 10000.0)
    md = AttentionMetadata(2, slots, [0, 1, 2], lens.tolist(), bt,
                           torch.tensor([0, 1, 2], dtype=torch.int32, device=DEVICE), lens, 1, 9)
    outs, caches = [], []
    for kernels in (False, True):
        attn = Attention(nq, hd, hd**-0.5, nkv)
        attn.kv_cache = cache.clone()
        if kernels:
            out = attn._forward_cuda(q.view(2, nq, hd), k.view(2, nkv, hd), v.view(2, nkv, hd),
                                     md, pos, rope, None, None)
        else:
            out = attn(q.clone(), k, v, md, pos, rope)
        outs.append(out)
        caches.append(attn.kv_cache)
    assert_close(outs[1], outs[0], atol=1e-4, rtol=1e-4)
    assert_close(caches[1], caches[0])


@gpu
@pytest.mark.parametrize("batch,kv_len", [(1, 32), (1, 1024), (64, 1000)])
def test_decode_with_rope_llama_shapes(batch: int, kv_len: int) -> None:
    q, k, v, cache, bt, lens, pos, slots, table = _step(
        [kv_len - i for i in range(batch)], 32, 8, 128, 128, 16, torch.bfloat16)
    want_cache = cache.clone()
    want = _unfused(q, k, v, want_cache, bt, lens, pos, slots, table, 128, None)
    out = paged_attention_decode(q.view(batch, 32, 128), cache, bt, lens, 128**-0.5,
                                 positions=pos, key=k, value=v, cos_sin_cache=table,
                                 slot_mapping=slots)
    torch.testing.assert_close(out.float(), want.float(), atol=2e-2, rtol=2e-2)
    assert_close(cache, want_cache)
