"""kernels/fused_moe_gemv.py (the decode GEMV path of the fused MoE) against its torch
references, fused_experts_triton's choice of it, and the routed kernels (the top-k softmax
folded into both GEMVs) against fused_topk: the same experts (ties to the lowest id,
E up to 512, top-k 1/2/8/10, renormalize on and off) and fused_moe_triton (the layer's
entry) equal to fused_topk + fused_experts_triton.

Mirrors vLLM 0.33 tests/kernels/moe/test_moe.py (test_fused_moe: fused_experts vs
torch_moe over m, n, k, e, topk, dtype) for the sparse decode regime (M * top_k * 4 <= E):
one token, 2 and 4 tokens, top-k 1/2/8 (and 10, padded to 16 slots), E 8..512, odd H and I
(row and column masks), int32 and int64 ids. On CPU under the Triton interpreter in
fp32/fp16 with tiny shapes; on CUDA also bf16 and the real Qwen3 / Mixtral sizes.
"""

from __future__ import annotations

import pytest
import torch
from test_kernels_common import DEVICE, DTYPES, assert_close, capture, cuda_only, gpu

import libvllm.kernels.fused_moe_gemv as moe_gemv
from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.layers.activation import GeluAndMul, SiluAndMul
from libvllm.engine.layers.fused_moe import (
    FusedMoE,
    fused_experts,
    fused_experts_triton,
    fused_moe_triton,
    fused_topk,
)
from libvllm.kernels.fused_moe_gemv import (
    fused_moe_gemv_config,
    fused_moe_gemv_w2,
    fused_moe_gemv_w2_ref,
    fused_moe_gemv_w2_routed,
    fused_moe_gemv_w13,
    fused_moe_gemv_w13_ref,
    fused_moe_gemv_w13_routed,
)
from libvllm.kernels.launch_configs import GemvConfig
from libvllm.kernels.moe_topk_softmax import topk_softmax, topk_softmax_ref


def inputs(m, e, h, i, topk, dtype, ids_dtype=torch.int32, seed=0):
    """x [m, h], w13 [e, 2i, h], w2 [e, h, i], weights [m, topk] fp32, ids [m, topk]
    distinct per token."""
    g = torch.Generator(DEVICE).manual_seed(seed)  # on the device: real sizes are GBs
    x = torch.randn(m, h, generator=g, device=DEVICE).to(dtype)
    w13 = (torch.randn(e, 2 * i, h, generator=g, device=DEVICE) / h**0.5).to(dtype)
    w2 = (torch.randn(e, h, i, generator=g, device=DEVICE) / i**0.5).to(dtype)
    ids = torch.rand(m, e, generator=g, device=DEVICE).topk(topk, dim=-1).indices
    ids = ids.to(ids_dtype)
    weights = torch.rand(m, topk, generator=g, device=DEVICE)
    return x, w13, w2, weights, ids


CASES = [  # m, e, h, i, topk
    (1, 8, 32, 16, 1), (1, 8, 40, 24, 2), (2, 64, 48, 20, 8), (4, 128, 33, 17, 8),
    (1, 512, 64, 32, 10), (3, 16, 16, 8, 1),
    (2, 32, 64, 13, 4), (1, 16, 18, 16, 2)]  # whole steps with partial row blocks
SMALL = GemvConfig(4, 16, 1, 1)  # BN, BK, warps, stages: several blocks and steps


@pytest.mark.parametrize("m,e,h,i,topk", CASES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("small", [False, True])
def test_gemv_kernels_match_the_reference(m, e, h, i, topk, dtype, small) -> None:
    ids_dtype = torch.int64 if m % 2 else torch.int32
    x, w13, w2, weights, ids = inputs(m, e, h, i, topk, dtype, ids_dtype, seed=m + e)
    cfg = SMALL if small else None
    act = fused_moe_gemv_w13(x, w13, ids, cfg)
    assert act.shape == (m * topk, i) and act.dtype == dtype
    assert_close(act, fused_moe_gemv_w13_ref(x, w13, ids))
    out = fused_moe_gemv_w2(act, w2, weights, ids, cfg)
    assert out.shape == (m, h) and out.dtype == dtype
    assert_close(out, fused_moe_gemv_w2_ref(act, w2, weights, ids))


def test_two_tokens_on_one_expert() -> None:
    """Tokens sharing experts (slots in different orders) each get their own sum."""
    x, w13, w2, weights, _ = inputs(2, 8, 24, 12, 2, torch.float32)
    ids = torch.tensor([[3, 5], [5, 3]], dtype=torch.int32, device=DEVICE)
    out = fused_moe_gemv_w2(fused_moe_gemv_w13(x, w13, ids), w2, weights, ids)
    want = fused_experts(x.cpu(), w13.cpu(), w2.cpu(), weights.cpu(), ids.cpu().long(),
                         SiluAndMul())
    assert_close(out.cpu(), want, atol=1e-5, rtol=1e-5)


def test_gemv_kernels_check_their_arguments() -> None:
    x, w13, w2, weights, ids = inputs(2, 8, 16, 8, 2, torch.float32)
    with pytest.raises(InvalidArgumentError, match="w13 must be"):
        fused_moe_gemv_w13(x, w13[:, :, :8], ids)
    with pytest.raises(InvalidArgumentError, match="w13 must be"):
        fused_moe_gemv_w13(x, w13.transpose(1, 2).contiguous().transpose(1, 2), ids)
    with pytest.raises(InvalidArgumentError, match="x must be"):
        fused_moe_gemv_w13(x.t(), w13, ids)
    with pytest.raises(InvalidArgumentError, match="topk_ids must be"):
        fused_moe_gemv_w13(x, w13, ids.float())
    act = fused_moe_gemv_w13(x, w13, ids)
    with pytest.raises(InvalidArgumentError, match="topk_weights must be"):
        fused_moe_gemv_w2(act, w2, weights.half(), ids)
    with pytest.raises(InvalidArgumentError, match="M \\* top_k"):
        fused_moe_gemv_w2(act[:3], w2, weights, ids)
    with pytest.raises(InvalidArgumentError, match="w2 must be"):
        fused_moe_gemv_w2(act, w2.half(), weights, ids)
    with pytest.raises(InvalidArgumentError, match=r"topk_ids must be .*\[M, top_k\]"):
        fused_moe_gemv_w2(act, w2, weights, ids.reshape(-1))
    with pytest.raises(InvalidArgumentError, match=r"topk_ids must be .*\[2, top_k\]"):
        fused_moe_gemv_w13(x, w13, ids[:1])


def test_config_defaults() -> None:
    assert fused_moe_gemv_config(2048, 768, 8) == (
        GemvConfig(8, 256, 4, 1), GemvConfig(1, 256, 1, 1))
    assert fused_moe_gemv_config(2048, 512, 8) == (
        GemvConfig(8, 256, 4, 1), GemvConfig(1, 256, 1, 1))
    assert fused_moe_gemv_config(4096, 14336, 2) == (
        GemvConfig(8, 256, 4, 1), GemvConfig(1, 512, 1, 1))
    assert fused_moe_gemv_config(2048, 768, 1).w2 == GemvConfig(1, 256, 1, 1)
    assert fused_moe_gemv_config(48, 20, 10) == (
        GemvConfig(8, 64, 4, 1), GemvConfig(1, 32, 1, 1))


@pytest.mark.parametrize("m,e,topk", [(1, 8, 2), (2, 16, 2), (3, 16, 2), (4, 128, 8),
                                       (1, 4, 1), (2, 4, 1), (1, 8, 8)])
def test_fused_experts_triton_takes_the_gemv_path_exactly_when_sparse(monkeypatch, m, e,
                                                                      topk) -> None:
    calls = []
    w13_fn, w2_fn = moe_gemv.fused_moe_gemv_w13, moe_gemv.fused_moe_gemv_w2
    monkeypatch.setattr(moe_gemv, "fused_moe_gemv_w13",
                        lambda *a, **k: calls.append("w13") or w13_fn(*a, **k))
    monkeypatch.setattr(moe_gemv, "fused_moe_gemv_w2",
                        lambda *a, **k: calls.append("w2") or w2_fn(*a, **k))
    x, w13, w2, weights, ids = inputs(m, e, 16, 8, topk, torch.float32, seed=m)
    want = fused_experts(x.cpu(), w13.cpu(), w2.cpu(), weights.cpu(), ids.cpu().long(),
                         SiluAndMul())
    got = fused_experts_triton(x, w13, w2, weights, ids, SiluAndMul())
    assert calls == (["w13", "w2"] if m * topk * 4 <= e else [])
    assert_close(got.cpu(), want, atol=1e-4, rtol=1e-4)
    if m == 1 and e == 8 and topk == 2:  # never with another activation, nor allow_gemv=False
        calls.clear()
        fused_experts_triton(x, w13, w2, weights, ids, GeluAndMul())
        fused_experts_triton(x, w13, w2, weights, ids, SiluAndMul(), allow_gemv=False)
        assert calls == []


QWEN3_30B = dict(e=128, h=2048, i=768, topk=8)
QWEN35_35B = dict(e=256, h=2048, i=512, topk=8)
QWEN3_NEXT = dict(e=512, h=2048, i=512, topk=10)
MIXTRAL = dict(e=8, h=4096, i=14336, topk=2)


@gpu
@pytest.mark.parametrize("shape", [QWEN3_30B, QWEN35_35B, QWEN3_NEXT, MIXTRAL],
                         ids=["qwen3-30b-a3b", "qwen3.5-35b-a3b", "qwen3-next", "mixtral"])
@pytest.mark.parametrize("m", [1, 4])
@pytest.mark.parametrize("dtype", [torch.bfloat16])  # fp16: the interpreter cases
def test_gemv_kernels_real_sizes(shape, m, dtype) -> None:
    x, w13, w2, weights, ids = inputs(m, shape["e"], shape["h"], shape["i"], shape["topk"],
                                      dtype, seed=m)
    act = fused_moe_gemv_w13(x, w13, ids)
    assert_close(act, fused_moe_gemv_w13_ref(x, w13, ids))
    out = fused_moe_gemv_w2(act, w2, weights, ids)
    assert_close(out, fused_moe_gemv_w2_ref(act, w2, weights, ids))
    # the four-launch path (tl.dot sums, each pair rounded before the top-k sum), at the
    # fused MoE tests' bf16 tolerance (tests/test_kernels_fused_moe.py)
    old = fused_experts_triton(x, w13, w2, weights, ids, SiluAndMul(), allow_gemv=False)
    assert ((out.float() - old.float()).abs().max() / old.float().abs().max()) < 2e-2


@gpu
def test_gemv_kernels_mixed_ids_bf16_cuda() -> None:
    """bf16 (round to nearest on the GPU) at tiny odd shapes, both id dtypes."""
    for ids_dtype in (torch.int32, torch.int64):
        x, w13, w2, weights, ids = inputs(3, 64, 33, 17, 4, torch.bfloat16, ids_dtype)
        act = fused_moe_gemv_w13(x, w13, ids, SMALL)
        assert_close(act, fused_moe_gemv_w13_ref(x, w13, ids))
        assert_close(fused_moe_gemv_w2(act, w2, weights, ids, SMALL),
                     fused_moe_gemv_w2_ref(act, w2, weights, ids))


def router_logits(m, e, kind, dtype, seed=0):
    """[m, e] logits: "random" (normal), "ties" (integers 0..2: most experts tie)."""
    g = torch.Generator(DEVICE).manual_seed(seed)
    if kind == "ties":
        return torch.randint(0, 3, (m, e), generator=g, device=DEVICE).to(dtype)
    return torch.randn(m, e, generator=g, device=DEVICE).to(dtype)


ROUTED_CASES = [  # m, e, h, i, topk
    (1, 8, 32, 16, 1), (1, 8, 40, 24, 2), (2, 64, 48, 20, 8), (4, 128, 33, 17, 8),
    (1, 512, 64, 32, 10), (1, 512, 16, 8, 8), (3, 16, 16, 8, 2), (1, 5, 16, 8, 1)]


# Kinds of logits and dtypes: on CPU (the interpreter; the slowest cases of this file) random
# logits in fp32 (where fused_topk is an oracle too) and ties in fp16, for every shape: each
# kind and each dtype runs every shape. The other pairs add no path (the integer ties are
# exact in every dtype, routing and weights go through fp32 alike) and run on CUDA only.
# The two shapes at the sparse limit with top-k 8 and the default config (M * top_k * 4 = E:
# 2 x 8 x 4 = 64, 4 x 8 x 4 = 128), the slowest here, split the two CPU pairs between them.
ROUTED_KINDS = [(kind, dtype) for kind in ("random", "ties") for dtype in DTYPES]
ROUTED_LIMIT = {(2, 64, 48, 20, 8): ("random", torch.float32),
                (4, 128, 33, 17, 8): ("ties", torch.float16)}


def _routed_case(shape, kind, dtype):
    if (kind == "random") != (dtype == torch.float32):
        return cuda_only(*shape, kind, dtype, why="a kind and dtype pair, each alone runs on "
                         "CPU with every shape")
    if ROUTED_LIMIT.get(shape, (kind, dtype)) != (kind, dtype):
        return cuda_only(*shape, kind, dtype, why="the other shape at the sparse limit with "
                         "top-k 8 in this kind and dtype")
    return (*shape, kind, dtype)


@pytest.mark.parametrize("m,e,h,i,topk,kind,dtype", [
    _routed_case(shape, kind, dtype) for kind, dtype in ROUTED_KINDS for shape in ROUTED_CASES],
    ids=[f"{kind}-dtype{j}-{'-'.join(map(str, shape))}"
         for j, (kind, _) in enumerate(ROUTED_KINDS) for shape in ROUTED_CASES])
def test_routed_kernels_route_as_fused_topk(m, e, h, i, topk, kind, dtype) -> None:
    x, w13, w2, _, _ = inputs(m, e, h, i, topk, dtype, seed=m + e)
    logits = router_logits(m, e, kind, dtype, seed=e + topk)
    cfg = SMALL if (m + topk) % 2 else None
    # w13 takes no renormalize: its experts are the same for both
    act = fused_moe_gemv_w13_routed(x, w13, logits, topk, cfg)
    for renormalize in (True, False):
        want_w, want_ids = topk_softmax_ref(logits, topk, renormalize)  # ties: lowest id
        # fused_topk's CUDA kernel (the same jit helper) picks these experts
        assert torch.equal(topk_softmax(logits, topk, renormalize)[1], want_ids)
        if kind == "random" and dtype == torch.float32:  # no ties: fused_topk on any device
            w, ids = fused_topk(logits, topk, renormalize)
            assert torch.equal(ids, want_ids)
            assert_close(w, want_w, atol=1e-6, rtol=1e-5)
        if renormalize:
            assert_close(act, fused_moe_gemv_w13(x, w13, want_ids, cfg))  # the same experts
        out = fused_moe_gemv_w2_routed(act, w2, logits, topk, renormalize, cfg)
        assert out.shape == (m, h) and out.dtype == dtype
        assert_close(out, fused_moe_gemv_w2_ref(act, w2, want_w, want_ids))


def test_routed_kernels_check_their_arguments() -> None:
    x, w13, w2, _, _ = inputs(2, 8, 16, 8, 2, torch.float32)
    logits = router_logits(2, 8, "random", torch.float32)
    with pytest.raises(InvalidArgumentError, match=r"gating_output must be \[2, E\]"):
        fused_moe_gemv_w13_routed(x, w13, logits[:1], 2)
    with pytest.raises(InvalidArgumentError, match="out of range"):
        fused_moe_gemv_w13_routed(x, w13, logits, 9)
    with pytest.raises(InvalidArgumentError, match="E <= 512"):
        fused_moe_gemv_w13_routed(x, w13, torch.zeros(2, 513, device=DEVICE), 2)
    with pytest.raises(InvalidArgumentError, match="float32, float16 or bfloat16"):
        fused_moe_gemv_w13_routed(x, w13, logits.int(), 2)
    act = fused_moe_gemv_w13_routed(x, w13, logits, 2)
    with pytest.raises(InvalidArgumentError, match="M \\* top_k"):
        fused_moe_gemv_w2_routed(act, w2, logits, 1, True)
    with pytest.raises(InvalidArgumentError, match="contiguous rows"):
        fused_moe_gemv_w2_routed(act, w2, logits.t(), 2, True)


@pytest.mark.parametrize("m,e,topk,renormalize", [
    (1, 8, 2, True), (2, 64, 8, False), (1, 512, 10, True), (4, 16, 1, True),
    (2, 8, 2, True), (1, 1024, 2, False)])  # not sparse; E > 512: fused_topk first
def test_fused_moe_triton_equals_fused_topk_then_the_experts(monkeypatch, m, e, topk,
                                                              renormalize) -> None:
    calls = []
    for name in ("fused_moe_gemv_w13_routed", "fused_moe_gemv_w2_routed"):
        fn = getattr(moe_gemv, name)
        monkeypatch.setattr(moe_gemv, name,
                            lambda *a, fn=fn, name=name, **k: calls.append(name) or fn(*a, **k))
    x, w13, w2, _, _ = inputs(m, e, 16, 8, topk, torch.float32, seed=m + e)
    logits = router_logits(m, e, "random", torch.float32, seed=m)
    got = fused_moe_triton(x, w13, w2, logits, topk, renormalize, SiluAndMul())
    assert len(calls) == (2 if m * topk * 4 <= e <= 512 else 0)
    w, ids = fused_topk(logits, topk, renormalize)
    assert_close(got, fused_experts_triton(x, w13, w2, w, ids, SiluAndMul()),
                 atol=1e-5, rtol=1e-5)
    if calls:  # never with another activation, nor allow_gemv=False
        calls.clear()
        want = fused_experts_triton(x, w13, w2, w, ids, GeluAndMul())
        assert_close(fused_moe_triton(x, w13, w2, logits, topk, renormalize, GeluAndMul()),
                     want, atol=1e-5, rtol=1e-5)
        fused_moe_triton(x, w13, w2, logits, topk, renormalize, SiluAndMul(), allow_gemv=False)
        assert calls == []


def moe_layer(e, topk, h, i, renormalize=True, dtype=torch.bfloat16):
    layer = FusedMoE(e, topk, h, i, renormalize=renormalize)
    g = torch.Generator().manual_seed(e)
    layer.w13_weight.data = (torch.randn(e, 2 * i, h, generator=g) / h**0.5).to(DEVICE, dtype)
    layer.w2_weight.data = (torch.randn(e, h, i, generator=g) / i**0.5).to(DEVICE, dtype)
    return layer


@gpu
@pytest.mark.parametrize("shape", [QWEN3_30B, QWEN3_NEXT], ids=["qwen3-30b-a3b", "qwen3-next"])
@pytest.mark.parametrize("m", [1, 4])
@pytest.mark.parametrize("renormalize", [True, False])
def test_fused_moe_layer_routed_gemv_equals_the_unfused_path_cuda(shape, m, renormalize) -> None:
    layer = moe_layer(shape["e"], shape["topk"], shape["h"], shape["i"], renormalize)
    x = torch.randn(m, shape["h"], device=DEVICE).bfloat16()
    logits = torch.randn(m, shape["e"], device=DEVICE).bfloat16()
    w, ids = fused_topk(logits, shape["topk"], renormalize)
    want = fused_experts_triton(x, layer.w13_weight, layer.w2_weight, w, ids, SiluAndMul())
    assert_close(layer(x, logits), want)


@gpu
def test_fused_moe_layer_routed_gemv_under_a_cuda_graph() -> None:
    """Router GEMV, then the routed w13 and w2 (which reads the logits before its PDL wait),
    replayed from a CUDA graph on new inputs: the eager unfused result every time."""
    from libvllm.engine.layers.linear import dense_linear

    e, topk, h, i = QWEN3_30B["e"], QWEN3_30B["topk"], QWEN3_30B["h"], QWEN3_30B["i"]
    layer = moe_layer(e, topk, h, i)
    gate = (torch.randn(e, h, device=DEVICE) / h**0.5).bfloat16()  # [E, H]
    x = torch.randn(1, h, device=DEVICE).bfloat16()

    def step():
        return layer(x, dense_linear(x, gate))

    graph, out = capture(step)
    for seed in range(8):
        x.copy_(torch.randn(1, h, generator=torch.Generator(DEVICE).manual_seed(seed),
                            device=DEVICE).bfloat16())
        graph.replay()
        w, ids = fused_topk(dense_linear(x, gate), topk, True)
        want = fused_experts_triton(x, layer.w13_weight, layer.w2_weight, w, ids, SiluAndMul())
        assert_close(out, want)


def test_routed_kernels_keep_ids_in_range_for_nan_logits() -> None:
    """Garbage router rows (a padded graph batch) still route to experts < E."""
    x, w13, w2, _, _ = inputs(2, 16, 16, 8, 4, torch.float32)
    logits = torch.full((2, 16), float("nan"), device=DEVICE)
    logits[1, 3] = -logits[1, 3].abs()  # a negative NaN too
    logits[1, :3] = 1.0
    ids = topk_softmax(logits, 4, True)[1].cpu()
    assert ids[0].tolist() == [0, 1, 2, 3]  # all NaN: all tie
    assert all(0 <= i < 16 for i in ids[1].tolist()) and len(set(ids[1].tolist())) == 4
    act = fused_moe_gemv_w13_routed(x, w13, logits, 4)
    assert_close(act, fused_moe_gemv_w13(x, w13, ids.to(DEVICE)))
    assert fused_moe_gemv_w2_routed(act, w2, logits, 4, True).shape == (2, 16)


def wide_logits(m, e, dtype, seed=0):
    """[m, e + 1] router output (Qwen3-Next's merged gate): its [:, :e] view (row stride
    e + 1) and the shared-expert gate column [m, 1]."""
    wide = router_logits(m, e + 1, "random", dtype, seed=seed)
    return wide[:, :e], wide[:, e:]


@pytest.mark.parametrize("m,e,h,i,topk,dtype", [
    (*shape, dtype) if shape[0] != 2 or dtype == torch.float32 else cuda_only(
        *shape, dtype, why="the default config runs in fp32, the 16-bit rounding bound with "
        "the other shapes")
    for shape in [(1, 8, 32, 16, 2), (2, 64, 48, 20, 8), (1, 512, 16, 8, 10),
                  (3, 16, 18, 13, 1)] for dtype in DTYPES])
def test_routed_kernels_take_strided_logits_and_the_shared_epilogue(m, e, h, i, topk,
                                                                     dtype) -> None:
    """A [:, :E] view of an [M, E + 1] router output routes as its contiguous copy; with
    shared_out and the gate column the w2 epilogue equals the torch composition
    routed + sigmoid(g) * shared_out (each op rounded to the dtype, as torch rounds)."""
    x, w13, w2, _, _ = inputs(m, e, h, i, topk, dtype, seed=m + e)
    logits, gate = wide_logits(m, e, dtype, seed=e)
    assert logits.stride(0) == e + 1
    for got, want in zip(topk_softmax(logits, topk, True),  # fused_topk's kernel, too
                         topk_softmax(logits.contiguous(), topk, True)):
        assert torch.equal(got, want)
    cfg = SMALL if m % 2 else None
    dense = logits.contiguous()  # made before w13: the routed w2 reads logits before its wait
    act = fused_moe_gemv_w13_routed(x, w13, logits, topk, cfg)
    assert torch.equal(act, fused_moe_gemv_w13_routed(x, w13, dense, topk, cfg))
    routed = fused_moe_gemv_w2_routed(act, w2, logits, topk, True, cfg)
    assert torch.equal(routed, fused_moe_gemv_w2_routed(act, w2, dense, topk, True, cfg))
    shared_out = torch.randn(m, h, device=DEVICE).to(dtype)
    got = fused_moe_gemv_w2_routed(act, w2, logits, topk, True, cfg, shared_out=shared_out,
                                   shared_gate=gate)
    shared = torch.sigmoid(gate) * shared_out
    want = routed + shared
    if dtype == torch.float32:
        assert_close(got, want)
    else:  # torch rounds routed, the sigmoid and the product to the dtype before its add; the
        # kernel adds in fp32 and rounds once. Each rounding is at most an ulp of its operand
        # (an H200 case: a sum of 0.016 off by 1.8e-3, over the default atol of 1e-3)
        bound = torch.finfo(dtype).eps * (routed.float().abs() + 2 * shared.float().abs()
                                          + want.float().abs())
        assert ((got.float() - want.float()).abs() <= bound).all()


@pytest.mark.parametrize("m,e,topk", [(1, 16, 2), (4, 16, 2)])  # routed; the GEMM path
def test_fused_moe_triton_adds_the_gated_shared_expert(monkeypatch, m, e, topk) -> None:
    calls = []
    fn = moe_gemv.fused_moe_gemv_w2_routed
    monkeypatch.setattr(moe_gemv, "fused_moe_gemv_w2_routed",
                        lambda *a, **k: calls.append(k["shared_out"]) or fn(*a, **k))
    x, w13, w2, _, _ = inputs(m, e, 16, 8, topk, torch.float32, seed=m)
    logits, gate = wide_logits(m, e, torch.float32, seed=m)
    shared_out = torch.randn(m, 16, device=DEVICE)
    got = fused_moe_triton(x, w13, w2, logits, topk, True, SiluAndMul(),
                           shared_out=shared_out, shared_gate=gate)
    assert len(calls) == (1 if m * topk * 4 <= e else 0)
    want = fused_moe_triton(x, w13, w2, logits, topk, True, SiluAndMul())
    assert_close(got, want + torch.sigmoid(gate) * shared_out, atol=1e-6, rtol=1e-6)


def test_shared_epilogue_checks_its_arguments() -> None:
    x, w13, w2, _, _ = inputs(2, 8, 16, 8, 2, torch.float32)
    logits, gate = wide_logits(2, 8, torch.float32)
    act = fused_moe_gemv_w13_routed(x, w13, logits, 2)
    shared_out = torch.zeros(2, 16, device=DEVICE)
    with pytest.raises(InvalidArgumentError, match="go together"):
        fused_moe_gemv_w2_routed(act, w2, logits, 2, True, shared_out=shared_out)
    with pytest.raises(InvalidArgumentError, match=r"shared_out must be a contiguous \[2, 16\]"):
        fused_moe_gemv_w2_routed(act, w2, logits, 2, True, shared_out=shared_out[:1],
                                 shared_gate=gate)
    with pytest.raises(InvalidArgumentError, match=r"shared_gate must be a \[2, 1\]"):
        fused_moe_gemv_w2_routed(act, w2, logits, 2, True, shared_out=shared_out,
                                 shared_gate=gate.reshape(-1))
    with pytest.raises(InvalidArgumentError, match=r"shared_gate must be a \[2, 1\] torch.float32"):
        fused_moe_gemv_w2_routed(act, w2, logits, 2, True, shared_out=shared_out,
                                 shared_gate=gate.half())


def test_engine_routed_expert_limit_is_the_kernels() -> None:
    """engine/layers/fused_moe/triton_experts.py keeps its own copy (kernels/ is imported
    lazily there): the two must not drift."""
    from libvllm.engine.layers.fused_moe.triton_experts import ROUTED_MAX_EXPERTS as engine_limit
    from libvllm.kernels.fused_moe_gemv import ROUTED_MAX_EXPERTS

    assert engine_limit == ROUTED_MAX_EXPERTS
