"""The fp8 KV cache (vLLM's --kv-cache-dtype fp8) in every kernel that writes or reads it,
against the kernels' torch references with the same k_scale / v_scale.

Oracle: kernels/reshape_and_cache.py quantize_kv_ref (x / scale in fp32, saturated to
+-448, rounded to nearest even into float8_e4m3fn: vLLM's triton_reshape_and_cache_flash
store) and dequantize_kv_ref (fp8 * scale in fp32, rounded to q's dtype: vLLM's
triton_unified_attention _cast_kv_tile), inside each kernel's *_ref. Mirrors vLLM 0.33
tests/kernels/attention/test_cache.py (test_reshape_and_cache_flash with kv_cache_dtype
fp8: the cache compared after the same quantization) and test_triton_unified_attention.py
(its fp8 KV cases: the reference attends over the dequantized cache).
Writes run on CUDA only: the Triton interpreter's fp32 -> float8e4nv cast drops the carry
of a rounding into the exponent (7.8 -> 4.0, not 8.0), so its bytes are not the GPU's.
Reads (fp8 -> fp32 is exact there) also run under the interpreter.
"""

from __future__ import annotations

import pytest
import torch
from test_kernels_common import DEVICE, ON_CUDA, gpu

from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.layers.rotary_embedding import RotaryEmbedding
from libvllm.kernels.decode_attention import paged_attention_decode, paged_attention_decode_ref
from libvllm.kernels.gemv_rope_cache import qkv_gemv_rope_cache, qkv_gemv_rope_cache_ref
from libvllm.kernels.paged_attention import paged_attention_prefill, paged_attention_prefill_ref
from libvllm.kernels.reshape_and_cache import (
    FP8_KV_DTYPE,
    dequantize_kv_ref,
    quantize_kv_ref,
    reshape_and_cache,
    reshape_and_cache_ref,
)
from libvllm.kernels.rotary_cache import rotary_embedding_and_cache, rotary_embedding_and_cache_ref

ACT = torch.bfloat16 if ON_CUDA else torch.float32  # the interpreter truncates bf16
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


def _scales(k: float = 0.05, v: float = 0.02) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.tensor(k, device=DEVICE), torch.tensor(v, device=DEVICE))


def _fp8_cache(blocks: int, bs: int, nkv: int, hd: int, ks, vs) -> torch.Tensor:
    """A random fp8 cache whose values span the e4m3 range after dequantization."""
    kv = torch.randn(2, blocks, bs, nkv, hd, device=DEVICE) * 2
    return torch.stack([quantize_kv_ref(kv[0], ks), quantize_kv_ref(kv[1], vs)])


def _bytes_equal(a: torch.Tensor, b: torch.Tensor) -> None:
    assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def _fp8_close(a: torch.Tensor, b: torch.Tensor) -> None:
    """Equal up to one e4m3 step where the kernel's activation rounding moved a value
    across a rounding boundary (rotary, GEMV: 1 ulp of bf16 before quantization)."""
    torch.testing.assert_close(a.float(), b.float(), rtol=2**-3, atol=2**-9)


def test_quantize_rule_saturates_and_rounds_to_nearest_even() -> None:
    s = torch.tensor(0.5)
    x = torch.tensor([1000.0, -1000.0, 3.9, 0.0, 7.0 * 0.5 + 0.25 * 0.5])
    q = quantize_kv_ref(x, s).float()
    assert q.tolist() == [448.0, -448.0, 8.0, 0.0, 7.0]  # 7.25 is a tie: 7.0 (even)
    assert torch.equal(dequantize_kv_ref(q.to(FP8_KV_DTYPE), s, torch.float32), q * 0.5)


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_reshape_and_cache_fp8_bytes_equal_ref(dtype) -> None:
    torch.manual_seed(0)
    n, blocks, bs, nkv, hd = 37, 8, 16, 4, 128
    k = torch.randn(n, nkv, hd, device=DEVICE).to(dtype) * 30  # some saturate at k_scale 0.05
    v = torch.randn(n, nkv, hd, device=DEVICE).to(dtype)
    ks, vs = _scales()
    slots = torch.randperm(blocks * bs, device=DEVICE)[:n]
    slots[3] = -1
    cache = torch.zeros(2, blocks, bs, nkv, hd, dtype=FP8_KV_DTYPE, device=DEVICE)
    want = cache.clone()
    reshape_and_cache_ref(k, v, want, slots, ks, vs)
    reshape_and_cache(k, v, cache, slots, ks, vs)
    _bytes_equal(cache, want)
    assert (want.float().abs() == 448.0).any()  # the saturating path ran


@gpu
@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("hs,rot", [(128, 128), (64, 32)])
def test_rotary_cache_fp8_matches_ref(qk_norm, hs, rot) -> None:
    torch.manual_seed(0)
    n, nq, nkv, blocks, bs = 9, 8, 2, 6, 4
    table = RotaryEmbedding(hs, rot, 4096, 10000.0).cos_sin_cache.to(DEVICE)
    positions = torch.randint(0, 4096, (n,), device=DEVICE)
    q, k, v = torch.randn(n, (nq + 2 * nkv) * hs, dtype=ACT, device=DEVICE).split(
        [nq * hs, nkv * hs, nkv * hs], dim=-1)
    norm = (torch.rand(hs, dtype=ACT, device=DEVICE) + 0.5,
            torch.rand(hs, dtype=ACT, device=DEVICE) + 0.5) if qk_norm else ()
    slots = torch.randperm(blocks * bs, device=DEVICE)[:n]
    slots[4] = -1
    ks, vs = _scales(0.01, 0.004)
    cache = torch.zeros(2, blocks, bs, nkv, hs, dtype=FP8_KV_DTYPE, device=DEVICE)
    want = cache.clone()
    want_q = rotary_embedding_and_cache_ref(positions, q.clone(), k, v, table, hs, want, slots,
                                            *norm, k_scale=ks, v_scale=vs)
    rotary_embedding_and_cache(positions, q, k, v, table, hs, cache, slots, *norm,
                               k_scale=ks, v_scale=vs)
    torch.testing.assert_close(q, want_q, atol=0.07, rtol=2e-2)
    _fp8_close(cache, want)
    _bytes_equal(cache[1], want[1])  # v is not rotated: exact


@gpu
@pytest.mark.parametrize("bias", [False, True])
def test_gemv_rope_cache_fp8_matches_ref(bias) -> None:
    torch.manual_seed(0)
    nq, nkv, hs, k = 8, 2, 128, 1024
    n = (nq + 2 * nkv) * hs
    ks, vs = _scales(0.02, 0.01)
    args = dict(x=torch.randn(1, k, dtype=ACT, device=DEVICE),
                w=(torch.randn(n, k, device=DEVICE) / k**0.5).to(ACT),
                bias=torch.randn(n, dtype=ACT, device=DEVICE) if bias else None,
                positions=torch.tensor([37], device=DEVICE),
                cos_sin_cache=RotaryEmbedding(hs, hs, 64, 10000.0).cos_sin_cache.to(DEVICE),
                slot_mapping=torch.tensor([5], device=DEVICE),
                num_q_heads=nq, num_kv_heads=nkv, head_size=hs)
    cache = torch.zeros(2, 4, 4, nkv, hs, dtype=FP8_KV_DTYPE, device=DEVICE)
    want = cache.clone()
    want_q = qkv_gemv_rope_cache_ref(**args, kv_cache=want, k_scale=ks, v_scale=vs)
    q = qkv_gemv_rope_cache(**args, kv_cache=cache, k_scale=ks, v_scale=vs)
    torch.testing.assert_close(q, want_q, atol=0.07, rtol=2e-2)
    _fp8_close(cache, want)
    assert cache.view(torch.uint8)[:, 1, 1].any()  # slot 5 written


def _attn_case(seq_lens, nq, nkv, hd, bs, seed=0):
    torch.manual_seed(seed)
    q_lens, kv_lens = [q for q, _ in seq_lens], [k for _, k in seq_lens]
    max_blocks = max(1, max(-(-k // bs) for k in kv_lens))
    blocks = len(seq_lens) * max_blocks + 3
    ks, vs = _scales(0.5, 0.25)
    q = torch.randn(sum(q_lens), nq, hd, dtype=ACT, device=DEVICE)
    qsl = torch.tensor([0, *q_lens], device=DEVICE).cumsum(0).to(torch.int32)
    lens = torch.tensor(kv_lens, dtype=torch.int32, device=DEVICE)
    bt = torch.randint(0, blocks, (len(seq_lens), max_blocks), dtype=torch.int32,
                       device=DEVICE)
    return q, _fp8_cache(blocks, bs, nkv, hd, ks, vs), qsl, lens, bt, ks, vs


@pytest.mark.parametrize("seq_lens", [[(1, 13), (5, 18), (9, 9)], [(7, 40)]])
@pytest.mark.parametrize("nq,nkv", [(4, 4), (8, 2)])
@pytest.mark.parametrize("num_segments", [1, 3])
def test_prefill_reads_fp8_cache(seq_lens, nq, nkv, num_segments) -> None:
    q, kv, qsl, lens, bt, ks, vs = _attn_case(seq_lens, nq, nkv, 32, 4)
    out = paged_attention_prefill(q, kv, qsl, lens, bt, 32**-0.5, block_m=16, tile_n=16,
                                  num_segments=num_segments, k_scale=ks, v_scale=vs)
    want = paged_attention_prefill_ref(q, kv, qsl, lens, bt, 32**-0.5, k_scale=ks, v_scale=vs)
    torch.testing.assert_close(out.float(), want.float(), atol=TOL[ACT], rtol=TOL[ACT])


@pytest.mark.parametrize("kv_lens", [[13, 1, 40], [17]])  # [17]: one row (ONE_ROW)
@pytest.mark.parametrize("num_splits,window", [(1, None), (3, 6)])
def test_decode_reads_fp8_cache(kv_lens, num_splits, window) -> None:
    q, kv, _, lens, bt, ks, vs = _attn_case([(1, k) for k in kv_lens], 8, 2, 32, 4)
    out = paged_attention_decode(q, kv, bt, lens, 32**-0.5, sliding_window=window,
                                 num_splits=num_splits, tile_n=16, k_scale=ks, v_scale=vs)
    want = paged_attention_decode_ref(q, kv, bt, lens, 32**-0.5, window, ks, vs)
    torch.testing.assert_close(out.float(), want.float(), atol=TOL[ACT], rtol=TOL[ACT])


def test_fp8_ref_is_attention_over_the_dequantized_cache() -> None:
    q, kv, qsl, lens, bt, ks, vs = _attn_case([(3, 20), (1, 7)], 4, 2, 32, 4)
    deq = torch.stack([dequantize_kv_ref(kv[0], ks, ACT), dequantize_kv_ref(kv[1], vs, ACT)])
    got = paged_attention_prefill_ref(q, kv, qsl, lens, bt, 0.2, k_scale=ks, v_scale=vs)
    assert torch.equal(got, paged_attention_prefill_ref(q, deq, qsl, lens, bt, 0.2))


@gpu
@pytest.mark.parametrize("batch,kv_len", [(1, 4096), (16, 1000)])
def test_llama_shapes_fp8_decode_and_prefill(batch, kv_len) -> None:
    q, kv, _, lens, bt, ks, vs = _attn_case([(1, kv_len)] * batch, 32, 8, 128, 16)
    out = paged_attention_decode(q, kv, bt, lens, 128**-0.5, k_scale=ks, v_scale=vs)
    want = paged_attention_decode_ref(q, kv, bt, lens, 128**-0.5, None, ks, vs)
    torch.testing.assert_close(out.float(), want.float(), atol=2e-2, rtol=2e-2)
    qsl = torch.arange(batch + 1, dtype=torch.int32, device=DEVICE)
    out = paged_attention_prefill(q, kv, qsl, lens, bt, 128**-0.5, k_scale=ks, v_scale=vs)
    torch.testing.assert_close(out.float(), want.float(), atol=2e-2, rtol=2e-2)


def test_fp8_cache_needs_its_scales() -> None:
    q, kv, qsl, lens, bt, ks, _ = _attn_case([(1, 5)], 4, 4, 32, 4)
    with pytest.raises(InvalidArgumentError, match="fp8 kv_cache needs v_scale"):
        paged_attention_prefill(q, kv, qsl, lens, bt, 0.2, k_scale=ks)
    with pytest.raises(InvalidArgumentError, match="fp8 kv_cache needs k_scale"):
        paged_attention_decode(q, kv, bt, lens, 0.2, k_scale=ks.double(), v_scale=ks)
    k = torch.randn(1, 4, 32, device=DEVICE)
    with pytest.raises(InvalidArgumentError, match="fp8 kv_cache needs k_scale"):
        reshape_and_cache(k, k, kv, torch.tensor([0], device=DEVICE))
    with pytest.raises(InvalidArgumentError, match="kv_cache must be float32, float16, "):
        reshape_and_cache(k, k, kv.view(torch.uint8), torch.tensor([0], device=DEVICE))
