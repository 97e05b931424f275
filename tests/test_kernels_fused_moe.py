"""kernels/fused_moe.py (fused_moe_kernel via invoke_fused_moe_kernel) against its reference,
and engine fused_experts (Triton path) against the engine's torch path.

Mirrors vLLM 0.33 tests/kernels/moe/test_moe.py (test_fused_moe: fused_experts vs
torch_moe over m, n, k, e, topk, dtype). Routings: random, empty experts, one token, all
tokens to one expert, top-k 1/2/8, E up to 512; both block assignments (aligned and
upstream's naive one for M * top_k * 4 <= E). On CPU under the Triton interpreter with small
shapes in fp32/fp16; real sizes (Qwen3-30B-A3B, Qwen3-Next, Mixtral) in bf16 on CUDA.
"""

from __future__ import annotations

import pytest
import torch
from test_kernels_common import (
    DEVICE,
    DTYPES,
    assert_close,
    cuda_only,
    gpu,
    run_without_host_sync,
)

from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.layers.activation import GeluAndMul, SiluAndMul
from libvllm.engine.layers.fused_moe import fused_experts, fused_experts_triton, fused_topk
from libvllm.kernels.activation import silu_and_mul_ref
from libvllm.kernels.fused_moe import invoke_fused_moe_kernel, invoke_fused_moe_kernel_ref
from libvllm.kernels.moe_align_block_size import moe_align_block_size
from libvllm.kernels.moe_topk_softmax import MAX_EXPERTS, topk_softmax, topk_softmax_ref

CONFIG = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 1,
          "num_warps": 4, "num_stages": 2}


def routing(m: int, e: int, topk: int, kind: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    if kind == "one_expert":  # every token's slots on experts 0..topk-1, expert 0 first
        ids = torch.arange(topk).expand(m, topk).clone()
    elif kind == "skewed":  # most experts empty
        ids = torch.rand(m, min(e, topk + 2), generator=g).topk(topk, dim=-1).indices
    else:
        ids = torch.rand(m, e, generator=g).topk(topk, dim=-1).indices
    weights = torch.rand(m, topk, generator=g)
    return weights.to(DEVICE), ids.to(torch.int32).to(DEVICE)


def moe_inputs(m, e, n, k, topk, dtype, kind="random", seed=0):
    g = torch.Generator().manual_seed(seed + 1)
    a = torch.randn(m, k, generator=g).to(dtype).to(DEVICE)
    b = (torch.randn(e, n, k, generator=g) / k**0.5).to(dtype).to(DEVICE)
    return a, b, *routing(m, e, topk, kind, seed)


def launches(routings, on_cuda):
    """(m, e, topk, kind, aligned, dtype) for every routing, block assignment and dtype; the
    ones on_cuda(m, e, aligned, dtype) names run on CUDA only: under the interpreter they
    are the slowest cases and repeat paths that other CPU cases run."""
    return [(*r, aligned, dtype) if not on_cuda(*r[:2], aligned, dtype) else cuda_only(
        *r, aligned, dtype, why=f"{on_cuda.__name__} in this file")
        for r in routings for aligned in (True, False) for dtype in DTYPES]


def naive_17_tokens(m, e, aligned, dtype) -> bool:
    """17 tokens x 8 slots in naive blocks (upstream's block assignment for M * top_k * 4 <= E,
    a program a pair: 136 of them). The naive blocks run on CPU in the other routings, top-k
    8 in (3, 512, 8); the 17 tokens in aligned blocks."""
    return m == 17 and not aligned


def naive_17_tokens_or_512_experts_in_fp16(m, e, aligned, dtype) -> bool:
    """Also the aligned blocks of 512 experts in fp16 (their fp32 case runs on CPU; fp16 runs
    with the other routings)."""
    return naive_17_tokens(m, e, aligned, dtype) or (
        e == 512 and aligned and dtype != torch.float32)


@pytest.mark.parametrize("m,e,topk,kind,aligned,dtype", launches(
    [(1, 4, 1, "random"), (1, 8, 2, "random"), (5, 16, 2, "skewed"), (17, 8, 8, "random"),
     (9, 8, 2, "one_expert"), (3, 512, 8, "random")], naive_17_tokens_or_512_experts_in_fp16))
def test_fused_moe_kernel_matches_reference(m, e, topk, kind, aligned, dtype) -> None:
    n, k = 48, 80  # N not a multiple of BLOCK_SIZE_N, K ends inside a step
    a, b, w, ids = moe_inputs(m, e, n, k, topk, dtype, kind, seed=m + e)
    if aligned:
        sorted_ids, expert_ids, post_pad = moe_align_block_size(ids, 16, e)
    else:
        sorted_ids, expert_ids, post_pad = None, ids.reshape(-1), None
    for mul in (False, True):
        c = torch.full((m, topk, n), float("nan"), dtype=dtype, device=DEVICE)
        invoke_fused_moe_kernel(a, b, c, w, sorted_ids, expert_ids, post_pad, mul, topk,
                                CONFIG)
        assert_close(c.view(m * topk, n), invoke_fused_moe_kernel_ref(a, b, w, ids, mul, topk))


@pytest.mark.parametrize("m,e,topk,kind,aligned,dtype", launches(
    [(1, 8, 2, "random"), (17, 8, 8, "random"), (9, 8, 2, "one_expert")], naive_17_tokens))
def test_silu_and_mul_in_the_epilogue(m, e, topk, kind, aligned, dtype) -> None:
    """The w13 launch with SiLU-and-mul in its epilogue equals the launch, then
    kernels/activation.py's silu_and_mul on its [pairs, 2N] output (the same roundings)."""
    n, k = 40, 80  # 2N = 80 merged gate|up rows; N not a multiple of BLOCK_SIZE_N // 2
    a, b, w, ids = moe_inputs(m, e, 2 * n, k, topk, dtype, kind, seed=m + e)
    if aligned:
        sorted_ids, expert_ids, post_pad = moe_align_block_size(ids, 16, e)
    else:
        sorted_ids, expert_ids, post_pad = None, ids.reshape(-1), None
    fused = torch.full((m * topk, n), float("nan"), dtype=dtype, device=DEVICE)
    invoke_fused_moe_kernel(a, b, fused, w, sorted_ids, expert_ids, post_pad, False, topk,
                            CONFIG, silu_and_mul=True)
    ref = silu_and_mul_ref(invoke_fused_moe_kernel_ref(a, b, w, ids, False, topk))
    assert_close(fused, ref)


def test_invoke_checks_its_arguments() -> None:
    a, b, w, ids = moe_inputs(2, 4, 16, 32, 2, torch.float32)
    post = torch.tensor([64], dtype=torch.int32, device=DEVICE)
    c = torch.empty(2, 2, 16, device=DEVICE)
    with pytest.raises(InvalidArgumentError, match="do not match"):
        invoke_fused_moe_kernel(a[:, :16], b, c, w, None, ids.reshape(-1), post, True, 2,
                                CONFIG)
    with pytest.raises(InvalidArgumentError, match="C must be"):
        invoke_fused_moe_kernel(a, b, c[:1], w, None, ids.reshape(-1), post, True, 2, CONFIG)
    with pytest.raises(InvalidArgumentError, match="share a dtype"):
        invoke_fused_moe_kernel(a.half(), b, c, w, None, ids.reshape(-1), post, True, 2,
                                CONFIG)
    with pytest.raises(InvalidArgumentError, match="no routed weight"):
        invoke_fused_moe_kernel(a, b, c[..., :8], w, None, ids.reshape(-1), post, True, 2,
                                CONFIG, silu_and_mul=True)


@pytest.mark.parametrize("m,e,topk", [(1, 8, 2), (5, 128, 8), (3, 512, 10), (4, 60, 1),
                                       (2, 6, 6)])
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_topk_softmax_matches_torch(m, e, topk, renormalize, dtype) -> None:
    logits = torch.randn(m, e, generator=torch.Generator().manual_seed(e)).to(dtype)
    w, ids = topk_softmax(logits.to(DEVICE), topk, renormalize)
    want_w, want_ids = topk_softmax_ref(logits, topk, renormalize)
    assert ids.dtype == torch.int32 and w.dtype == torch.float32
    assert_close(w.cpu(), want_w, atol=1e-6, rtol=1e-5)
    # ids: distinct, and each one's probability is its weight (equal logits may swap)
    probs = torch.softmax(logits.float(), -1).gather(1, ids.cpu().long())
    if renormalize:
        probs = probs / probs.sum(-1, keepdim=True)
    assert_close(probs, w.cpu(), atol=1e-6, rtol=1e-5)
    assert all(len(set(r)) == topk for r in ids.tolist())
    if dtype == torch.float32:  # no ties: the same order as torch.topk
        assert torch.equal(ids.cpu(), want_ids)


def test_topk_softmax_bad_arguments() -> None:
    with pytest.raises(InvalidArgumentError, match="out of range"):
        topk_softmax(torch.zeros(2, 4, device=DEVICE), 5, True)
    with pytest.raises(InvalidArgumentError, match="out of range"):
        topk_softmax(torch.zeros(1, MAX_EXPERTS + 1, device=DEVICE), 2, True)
    with pytest.raises(InvalidArgumentError, match="float32"):
        topk_softmax(torch.zeros(2, 4, dtype=torch.int32, device=DEVICE), 2, True)


def experts_inputs(m, e, h, i, topk, dtype, kind="random", seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, h, generator=g).to(dtype).to(DEVICE)
    w13 = (torch.randn(e, 2 * i, h, generator=g) / h**0.5).to(dtype).to(DEVICE)
    w2 = (torch.randn(e, h, i, generator=g) / i**0.5).to(dtype).to(DEVICE)
    logits = torch.randn(m, e, generator=g).to(DEVICE)
    weights, ids = fused_topk(logits, topk, renormalize=True)
    if kind == "one_expert":
        ids = torch.zeros_like(ids) + torch.arange(topk, device=DEVICE)
    return x, w13, w2, weights, ids


@pytest.mark.parametrize("m,e,topk,kind", [(1, 8, 2, "random"), (1, 64, 8, "random"),
                                           (6, 16, 1, "random"), (20, 8, 2, "one_expert"),
                                           (2, 512, 8, "random")])
@pytest.mark.parametrize("act", [SiluAndMul, lambda: GeluAndMul("tanh")],
                         ids=["silu-in-epilogue", "gelu-apart"])
def test_fused_experts_triton_matches_the_torch_path(m, e, topk, kind, act) -> None:
    dtype = torch.float32
    x, w13, w2, weights, ids = experts_inputs(m, e, 32, 32, topk, dtype, kind, seed=m)
    got = fused_experts_triton(x, w13, w2, weights, ids, act(), config=CONFIG)
    want = fused_experts(x.cpu(), w13.cpu(), w2.cpu(), weights.cpu(), ids.cpu().long(),
                         act())
    assert_close(got.cpu(), want, atol=1e-4, rtol=1e-4)


QWEN3_30B = dict(e=128, h=2048, i=768, topk=8)
QWEN3_NEXT = dict(e=512, h=2048, i=512, topk=10)
MIXTRAL = dict(e=8, h=4096, i=14336, topk=2)


# Mixtral stops at 256 tokens: at 2048 the torch reference is slow; smaller M cover its configs.
REAL_SIZES = [pytest.param(shape, m, id=f"{m}-{name}") for name, shape, ms in [
    ("qwen3-30b-a3b", QWEN3_30B, (1, 2, 8, 32, 64, 256, 2048)),
    ("qwen3-next", QWEN3_NEXT, (1, 2, 8, 32, 64, 256, 2048)),
    ("mixtral", MIXTRAL, (1, 2, 8, 32, 64, 256))] for m in ms]


@gpu
@pytest.mark.parametrize("shape,m", REAL_SIZES)
def test_fused_experts_triton_real_sizes_bf16(shape, m) -> None:
    """Tuned / default configs at real sizes (the ones CUDA graphs capture, and prefill)."""
    x, w13, w2, weights, ids = experts_inputs(m, shape["e"], shape["h"], shape["i"],
                                              shape["topk"], torch.bfloat16, seed=m)
    got = fused_experts_triton(x, w13, w2, weights, ids, SiluAndMul())
    want = fused_experts(x, w13, w2, weights, ids.long(), SiluAndMul())
    err = ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()
    assert err < 2e-2


@gpu
def test_fused_experts_triton_all_tokens_to_one_expert_bf16() -> None:
    x, w13, w2, weights, ids = experts_inputs(512, 128, 2048, 768, 8, torch.bfloat16,
                                              "one_expert")
    got = fused_experts_triton(x, w13, w2, weights, ids, SiluAndMul())
    want = fused_experts(x, w13, w2, weights, ids.long(), SiluAndMul())
    assert ((got.float() - want.float()).abs().max() / want.float().abs().max()) < 2e-2


@gpu
@pytest.mark.parametrize("m", [1, 4, 32, 2048])  # naive at 1 and 4; Triton align; torch align
def test_fused_experts_triton_no_host_sync_and_cuda_graph_replay(m) -> None:
    """No op of the path synchronizes with the host (torch's sync debug mode raises), and a
    CUDA graph captured once replays new routings and inputs (the decode graphs and async
    scheduling rely on both)."""
    shape = QWEN3_30B
    x, w13, w2, weights, ids = experts_inputs(m, shape["e"], shape["h"], shape["i"],
                                              shape["topk"], torch.bfloat16, seed=m)
    logits = torch.randn(m, shape["e"], device=DEVICE)
    act = SiluAndMul()

    def step():
        w, i = fused_topk(logits, shape["topk"], True)
        return fused_experts_triton(x, w13, w2, w, i, act)

    run_without_host_sync(step)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for seed in range(3):
        g = torch.Generator(device=DEVICE).manual_seed(seed)
        logits.copy_(torch.randn(logits.shape, device=DEVICE, generator=g))
        x.copy_(torch.randn(x.shape, device=DEVICE, generator=g).to(x.dtype))
        graph.replay()
        torch.cuda.synchronize()
        w, i = fused_topk(logits, shape["topk"], True)
        want = fused_experts(x, w13, w2, w, i.long(), act)
        assert ((out.float() - want.float()).abs().max() / want.float().abs().max()) < 2e-2
