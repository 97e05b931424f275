"""kernels/gemv_rope_cache.py (one-row qkv GEMV with RoPE and the KV-cache write in its
epilogue) against the unfused path.

Oracle: qkv_gemv_rope_cache_ref = dense_gemv_ref (F.linear in fp32 rounded to x's dtype),
then rotary_embedding_and_cache_ref (the engine's RotaryEmbedding.forward_native, then
reshape_and_cache with padding slots skipped); and, bit for bit, the two kernels it
replaces (kernels/gemv.py dense_gemv, then kernels/rotary_cache.py
rotary_embedding_and_cache) at equal BK. Shapes: Llama-like small heads (4 q / 2 kv heads
of 16..64), K a multiple of BK or with a masked tail, bias or none, head sizes whose
half is not a multiple of the default 4 pairs, config overrides; the cache rows at the slot
and every other entry untouched, slot -1 (PAD_SLOT_ID) writes nothing, positions 0 and
the table's last. On CUDA also Llama-3.1-8B's shapes in bf16 (bit-equal to the pair,
eager and under a CUDA graph). Runs on CUDA or under the Triton interpreter
(tests/test_kernels_common.py). vLLM has no such kernel (its fusion pass stops at rope +
cache); the cases follow tests/test_kernels_gemv.py and tests/test_kernels_rotary_cache.py.
"""

from __future__ import annotations

import pytest
import torch
from test_kernels_common import DEVICE, ON_CUDA, assert_close, cuda_only, gpu

from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.layers.rotary_embedding import RotaryEmbedding
from libvllm.kernels.gemv import dense_gemv
from libvllm.kernels.gemv_rope_cache import (
    gemv_rope_cache_config,
    qkv_gemv_rope_cache,
    qkv_gemv_rope_cache_ref,
)
from libvllm.kernels.launch_configs import GemvConfig
from libvllm.kernels.rotary_cache import rotary_embedding_and_cache

# bf16 too on CPU: the interpreter truncates to bf16 (1 ulp), inside the bf16 tolerance
ALL_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
MAX_POS, NUM_BLOCKS, BLOCK_SIZE = 64, 4, 4
# fp16 / bf16: a GEMV output one ulp off F.linear's (summation order; the interpreter
# truncates bf16) may cancel in the rotation: 2 ulps of 8 absolute (|q|, |k| < 8 here)
HALF_ATOL = {torch.float16: 2 * 8 * 2**-11, torch.bfloat16: 2 * 8 * 2**-8}


def _inputs(nq: int, nkv: int, hs: int, k: int, dtype: torch.dtype, bias: bool, pos: int = 37,
            slot: int = 5, seed: int = 0, max_pos: int = MAX_POS) -> dict:
    """The launcher's arguments: x [1, K], w [(nq + 2 nkv) * hs, K], a random cache."""
    torch.manual_seed(seed)
    n = (nq + 2 * nkv) * hs
    return dict(
        x=torch.randn(1, k, dtype=dtype, device=DEVICE),
        w=(torch.randn(n, k, device=DEVICE) / k**0.5).to(dtype),
        bias=torch.randn(n, dtype=dtype, device=DEVICE) if bias else None,
        positions=torch.tensor([pos], device=DEVICE),
        cos_sin_cache=RotaryEmbedding(hs, hs, max_pos, 10000.0).cos_sin_cache.to(DEVICE),
        kv_cache=torch.randn(2, NUM_BLOCKS, BLOCK_SIZE, nkv, hs, dtype=dtype, device=DEVICE),
        slot_mapping=torch.tensor([slot], device=DEVICE),
        num_q_heads=nq, num_kv_heads=nkv, head_size=hs)


def _run_both(args: dict, config=None) -> tuple[torch.Tensor, ...]:
    """(q, cache) of the kernel, (q, cache) of the reference, the cache before."""
    before = args["kv_cache"].clone()
    want_cache = before.clone()
    want_q = qkv_gemv_rope_cache_ref(**{**args, "kv_cache": want_cache})
    q = qkv_gemv_rope_cache(**args, config=config)
    return q, args["kv_cache"], want_q, want_cache, before


def _untouched_but_slot(cache: torch.Tensor, before: torch.Tensor, slot: int) -> None:
    """Every cache entry other than the slot's k and v rows is as before."""
    keep = torch.ones(cache.shape[:3], dtype=torch.bool, device=cache.device)
    if slot >= 0:
        keep[:, slot // BLOCK_SIZE, slot % BLOCK_SIZE] = False
    assert torch.equal(cache[keep], before[keep])


_HS64_K1100 = ("hs 32 at K 1100 (the same steps and masked tail, half the programs a head) "
               "and test_equals_the_kernel_pair_bit_for_bit's hs 64 at K 1100")


@pytest.mark.parametrize("hs,k", [  # K: EVEN_K; full 512-wide steps + a masked tail
    (16, 64), (16, 1100), (32, 64), (32, 1100), (64, 64),
    cuda_only(64, 1100, why=_HS64_K1100)])
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("bias", [False, True])
def test_qkv_gemv_rope_cache_matches_unfused(hs: int, k: int, dtype: torch.dtype,
                                             bias: bool) -> None:
    args = _inputs(4, 2, hs, k, dtype, bias)
    q, cache, want_q, want_cache, before = _run_both(args)
    assert q.shape == (1, 4 * hs) and q.dtype == dtype
    assert_close(q, want_q, HALF_ATOL.get(dtype))
    assert_close(cache, want_cache, HALF_ATOL.get(dtype))
    _untouched_but_slot(cache, before, 5)
    assert not torch.equal(cache[:, 1, 1], before[:, 1, 1])  # slot 5 written


_PAIR_K1100 = ("the float32 K = 1100 case (the same steps; the dtype changes only the "
               "epilogue's rounding, which K = 64 and K = 100 check in every dtype)")


@pytest.mark.parametrize("k,bias,dtype", [
    *[(k, b, d) for k, b in [(64, False), (100, True)] for d in ALL_DTYPES],
    (1100, True, torch.float32),
    *[cuda_only(1100, True, d, why=_PAIR_K1100) for d in ALL_DTYPES[1:]]])
def test_equals_the_kernel_pair_bit_for_bit(k: int, bias: bool, dtype: torch.dtype) -> None:
    """dense_gemv then rotary_embedding_and_cache (the launches it replaces), same BK. On
    CUDA an fp32 GEMV's sum order follows its warp count, which dense_gemv_config picks by shape:
    there fp32 is within 1e-5 (bf16 on the Llama shapes is bit-equal, test below)."""
    args = _inputs(4, 2, 64, k, dtype, bias, seed=1)
    cache = args["kv_cache"].clone()
    qkv = dense_gemv(args["x"], args["w"], args["bias"])
    q, kk, v = qkv.split([4 * 64, 2 * 64, 2 * 64], dim=-1)
    rotary_embedding_and_cache(args["positions"], q, kk, v, args["cos_sin_cache"], 64, cache,
                               args["slot_mapping"])
    got = qkv_gemv_rope_cache(**args)
    if ON_CUDA and dtype == torch.float32:
        torch.testing.assert_close(got, q, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(args["kv_cache"], cache, atol=1e-5, rtol=1e-5)
        return
    assert torch.equal(got, q)
    assert torch.equal(args["kv_cache"], cache)


def test_padding_slot_writes_nothing() -> None:
    args = _inputs(4, 2, 32, 64, torch.float32, True, slot=-1)
    q, cache, want_q, want_cache, before = _run_both(args)
    assert_close(q, want_q)  # q is still rotated
    assert torch.equal(cache, before)


@pytest.mark.parametrize("pos", [0, MAX_POS - 1])
@pytest.mark.parametrize("slot", [0, NUM_BLOCKS * BLOCK_SIZE - 1])
def test_first_and_last_position_and_slot(pos: int, slot: int) -> None:
    args = _inputs(4, 2, 32, 64, torch.float32, False, pos=pos, slot=slot)
    q, cache, want_q, want_cache, before = _run_both(args)
    assert_close(q, want_q)
    assert_close(cache, want_cache)
    _untouched_but_slot(cache, before, slot)
    if pos == 0:  # cos 1, sin 0: q is the plain projection
        assert_close(q, (args["x"] @ args["w"][:4 * 32].T))


@pytest.mark.parametrize("config", [(2, 64, 1, 1), (4, 32, 2, 1), (16, 256, 4, 2),
                                    (32, 128, 8, 3)])
def test_launch_config_override(config) -> None:
    """A sweep's config computes the same (BN / 2 pairs dividing head_size / 2 = 16); K
    140: whole BK steps, then a masked one (BK 256: the masked one only)."""
    args = _inputs(4, 2, 32, 140, torch.float32, True)
    q, cache, want_q, want_cache, _ = _run_both(args, GemvConfig(*config))
    assert_close(q, want_q)
    assert_close(cache, want_cache)


@pytest.mark.parametrize("nq,nkv,hs", [(3, 1, 12), (2, 2, 4), (1, 1, 2), (5, 1, 40)])
def test_head_halves_not_a_multiple_of_four_pairs(nq: int, nkv: int, hs: int) -> None:
    """The default 4 pairs a program drop to 2 or 1 when head_size / 2 needs it."""
    args = _inputs(nq, nkv, hs, 96, torch.float32, True)
    q, cache, want_q, want_cache, before = _run_both(args)
    assert_close(q, want_q)
    assert_close(cache, want_cache)
    _untouched_but_slot(cache, before, 5)


def test_int32_positions_and_slots_and_an_fp32_cache() -> None:
    args = _inputs(4, 2, 16, 64, torch.float16, False)
    args.update(positions=args["positions"].int(), slot_mapping=args["slot_mapping"].int(),
                kv_cache=args["kv_cache"].float())
    q, cache, want_q, want_cache, _ = _run_both(args)
    assert_close(q, want_q, HALF_ATOL[torch.float16])
    assert_close(cache, want_cache, HALF_ATOL[torch.float16])


def test_gemv_rope_cache_config_is_the_qkv_gemv_config() -> None:
    assert gemv_rope_cache_config(4096) == GemvConfig(8, 512, 4, 2)  # dense_gemv_config(6144, 4096)
    assert gemv_rope_cache_config(100) == GemvConfig(8, 128, 4, 2)  # BK shrinks to next_pow2(K)


@pytest.mark.parametrize("change,match", [
    (dict(x=torch.zeros(2, 64)), r"one row \[1, K\]"),
    (dict(x=torch.zeros(1, 128, device=DEVICE)[:, ::2]), "contiguous last dimension"),
    (dict(x=torch.zeros(1, 64, dtype=torch.int32)), "float32, float16 or bfloat16"),
    (dict(w=torch.zeros(127, 64)), r"w must be a contiguous \[128, 64\]"),
    (dict(w=torch.zeros(64, 128).t()), r"w must be a contiguous \[128, 64\]"),
    (dict(w=torch.zeros(128, 64, dtype=torch.float16)), "w must be torch.float32 like x"),
    (dict(bias=torch.zeros(127)), r"bias must be a contiguous \[128\]"),
    (dict(bias=torch.zeros(128, dtype=torch.float16)), r"bias must be a contiguous \[128\]"),
    (dict(positions=torch.zeros(2, dtype=torch.int64)), "one token's position"),
    (dict(positions=torch.zeros(1)), "int32/int64"),
    (dict(cos_sin_cache=torch.zeros(8, 8)), "rotary_dim 8 must be head_size 16"),
    (dict(cos_sin_cache=torch.zeros(8, 16, dtype=torch.float16)), "float32"),
    (dict(kv_cache=torch.zeros(2, 4, 4, 3, 16)), r"kv_cache must be \[2, num_blocks"),
    (dict(kv_cache=torch.zeros(2, 4, 4, 2, 32, device=DEVICE)[..., ::2]),
     r"kv_cache must be \[2, num_bl"),
    (dict(kv_cache=torch.zeros(2, 4, 4, 2, 16, dtype=torch.int8)), "kv_cache must be float"),
    (dict(slot_mapping=torch.zeros(2, dtype=torch.int64)), r"slot_mapping must be a \[1\]"),
    (dict(slot_mapping=torch.zeros(1)), r"slot_mapping must be a \[1\]"),
    (dict(num_q_heads=0), "need q and kv heads"),
    (dict(head_size=15), "even head_size"),
    (dict(config=GemvConfig(32, 64, 4, 2)), "BN / 2 dividing head_size / 2 = 8"),
    (dict(config=GemvConfig(1, 64, 4, 2)), "BN 1 must be even"),
])
def test_rejects_bad_input(change: dict, match: str) -> None:
    args = _inputs(4, 2, 16, 64, torch.float32, True)
    args.update({name: t.to(DEVICE) if isinstance(t, torch.Tensor) else t
                 for name, t in change.items()})
    with pytest.raises(InvalidArgumentError, match=match):
        qkv_gemv_rope_cache(**args)


def test_rejects_tensors_on_two_devices() -> None:
    args = _inputs(4, 2, 16, 64, torch.float32, False)
    args["positions"] = torch.zeros(1, dtype=torch.int64, device="meta")
    with pytest.raises(InvalidArgumentError, match="must be on one device"):
        qkv_gemv_rope_cache(**args)


def _llama_8b(pos: int, slot: int, seed: int) -> dict:
    """Llama-3.1-8B's qkv: K = 4096, 32 q / 8 kv heads of 128, bf16; a 64k-position table."""
    torch.manual_seed(seed)
    args = _inputs(32, 8, 128, 4096, torch.bfloat16, False, pos, slot, seed, max_pos=65536)
    args["kv_cache"] = torch.randn(2, 64, 16, 8, 128, dtype=torch.bfloat16, device=DEVICE)
    return args


def _kernel_pair(args: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, cache) of dense_gemv then rotary_embedding_and_cache on a copy of the cache."""
    cache = args["kv_cache"].clone()
    q, k, v = dense_gemv(args["x"], args["w"], args["bias"]).split([4096, 1024, 1024], dim=-1)
    rotary_embedding_and_cache(args["positions"], q, k, v, args["cos_sin_cache"], 128, cache,
                               args["slot_mapping"])
    return q, cache


@gpu
@pytest.mark.parametrize("pos,slot,bias", [(0, 0, False), (4321, 517, False),
                                           (65535, 1023, True), (77, -1, False)])
def test_llama_shapes_bf16_equal_the_kernel_pair(pos: int, slot: int, bias: bool) -> None:
    args = _llama_8b(pos, slot, seed=pos)
    if bias:  # Qwen2's qkv bias
        args["bias"] = torch.randn(6144, dtype=torch.bfloat16, device=DEVICE)
    want_q, want_cache = _kernel_pair(args)
    before = args["kv_cache"].clone()
    q = qkv_gemv_rope_cache(**args)
    assert torch.equal(q, want_q)
    assert torch.equal(args["kv_cache"], want_cache)
    assert torch.equal(args["kv_cache"], before) == (slot < 0)
    want_cache = before.clone()
    assert_close(q, qkv_gemv_rope_cache_ref(**{**args, "kv_cache": want_cache}),
                 HALF_ATOL[torch.bfloat16])


@gpu
def test_llama_shapes_under_a_cuda_graph() -> None:
    """Captured once, replayed with new x, position and slot: as eager, no host sync."""
    args = _llama_8b(5, 17, seed=7)
    qkv_gemv_rope_cache(**args)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q = qkv_gemv_rope_cache(**args)
    for pos, slot in ((9, 40), (60000, 1000), (3, -1)):
        args["x"].copy_(torch.randn_like(args["x"]))
        args["positions"].fill_(pos)
        args["slot_mapping"].fill_(slot)
        want_q, want_cache = _kernel_pair(args)
        graph.replay()
        assert torch.equal(q, want_q)
        assert torch.equal(args["kv_cache"], want_cache)
