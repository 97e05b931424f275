"""kernels/moe_gguf.py (the fused MoE GEMM over raw GGUF expert blocks), GGUFExperts and the
loader keeping a GGUF MoE file's experts quantized.

Oracle: the experts dequantized by engine/gguf/dequant.py (test_kernels_gguf_gemm's
gguf_dequantize_ref of [E, N, row_bytes]), then
kernels/fused_moe.py's reference (invoke_fused_moe_kernel_ref) or the engine's host path
(fused_experts). Random block bytes with finite scales (test_kernels_gguf_gemm.random_weight)
for Q8_0 (32-value blocks) and Q4_K (256-value super-blocks); all 8 types on CUDA.
Routings: random, one token, all pairs to one expert, both block assignments.
Mirrors vLLM 0.33 tests/kernels/quantization/test_gguf.py (test_moe: fused_moe_gguf against
fused_experts on dequantized weights). Runs on CUDA or under the Triton interpreter.
"""

from __future__ import annotations

import pytest
import torch
from test_kernels_common import DEVICE, ON_CUDA, cuda_only, gpu
from test_kernels_gguf_gemm import TYPES, gguf_dequantize_ref, random_weight

from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.gguf.constants import GGMLType
from libvllm.engine.layers.activation import SiluAndMul
from libvllm.engine.layers.fused_moe import fused_experts, fused_topk
from libvllm.engine.layers.fused_moe.gguf_experts import GGUFExperts
from libvllm.kernels.fused_moe import invoke_fused_moe_kernel_ref
from libvllm.kernels.moe_align_block_size import moe_align_block_size
from libvllm.kernels.moe_gguf import invoke_fused_moe_gguf_kernel

CPU_TYPES = [GGMLType.Q8_0, GGMLType.Q4_K]


def experts(qtype, e: int, n: int, k: int, seed: int = 0) -> torch.Tensor:
    return random_weight(qtype, e * n, k, seed).view(e, n, -1)


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30))



@pytest.mark.parametrize("qtype", TYPES if ON_CUDA else CPU_TYPES)
@pytest.mark.parametrize("m,e,topk,kind,aligned", [
    (*r, aligned) if r[0] != 19 or aligned else cuda_only(
        *r, aligned, why="57 pairs in naive blocks (a program a pair); naive blocks run with "
        "the other routings, the 19 tokens in aligned blocks")
    for aligned in (True, False)
    for r in [(1, 8, 2, "random"), (5, 4, 2, "one_expert"), (19, 6, 3, "random")]])
def test_fused_moe_gguf_kernel_matches_reference(qtype, m, e, topk, kind, aligned) -> None:
    k, n = 256, 40  # one super-block / eight blocks per row; N ends inside BLOCK_SIZE_N
    qw = experts(qtype, e, n, k, seed=m)
    g = torch.Generator().manual_seed(m)
    a = torch.randn(m, k, generator=g).to(DEVICE)
    ids = (torch.arange(topk).expand(m, topk) if kind == "one_expert"
           else torch.rand(m, e, generator=g).topk(topk, -1).indices).to(torch.int32)
    ids, w = ids.to(DEVICE), torch.rand(m, topk, generator=g).to(DEVICE)
    if aligned:
        sorted_ids, expert_ids, post = moe_align_block_size(ids, 16, e)
    else:
        sorted_ids, expert_ids, post = None, ids.reshape(-1), None
    dense = gguf_dequantize_ref(qw, qtype, torch.float32)
    for mul in (False, True):
        wide = torch.full((m * topk, n + 8), float("nan"), device=DEVICE)
        c = wide[:, 8:]  # a column slice of a wider buffer, as gate | up in different types
        invoke_fused_moe_gguf_kernel(a, qw, qtype, c, w, sorted_ids, expert_ids, post, mul,
                                     topk)
        assert _rel_err(c, invoke_fused_moe_kernel_ref(a, dense, w, ids, mul, topk)) < 1e-5


def test_bad_expert_blocks() -> None:
    a = torch.randn(2, 256, device=DEVICE)
    qw = experts(GGMLType.Q8_0, 4, 16, 256)
    c = torch.empty(4, 16, device=DEVICE)
    ids = torch.zeros(4, dtype=torch.int32, device=DEVICE)
    post = torch.tensor([64], dtype=torch.int32, device=DEVICE)
    with pytest.raises(InvalidArgumentError, match="E, N, row_bytes"):
        invoke_fused_moe_gguf_kernel(a, qw[0], GGMLType.Q8_0, c, None, None, ids, post, False, 2)
    with pytest.raises(InvalidArgumentError, match="not support"):
        invoke_fused_moe_gguf_kernel(a, qw, 0, c, None, None, ids, post, False, 2)
    with pytest.raises(InvalidArgumentError, match=r"A must be \[M, 256\]"):
        invoke_fused_moe_gguf_kernel(a[:, :128], qw, GGMLType.Q8_0, c, None, None, ids, post,
                                     False, 2)


def _gguf_layer(types, e, h, i):
    gate, up = experts(types[0], e, i, h, 1), experts(types[1], e, i, h, 2)
    down = experts(types[2], e, h, i, 3)
    w13 = [(torch.cat([gate, up], 1), types[0])] if types[0] == types[1] else \
        [(gate, types[0]), (up, types[1])]
    layer = GGUFExperts(w13, (down, types[2]))
    dense13 = torch.cat([gguf_dequantize_ref(gate, types[0], torch.float32),
                         gguf_dequantize_ref(up, types[1], torch.float32)], 1)
    return layer, dense13, gguf_dequantize_ref(down, types[2], torch.float32)


MIXED = (GGMLType.Q4_K, GGMLType.Q8_0, GGMLType.Q4_K)  # gate and up in two shards


@pytest.mark.parametrize("m,types", [
    (m, types) if (m, types) != (40, MIXED) else cuda_only(
        m, types, why="the dequantized path with Q8_0 experts; the two w13 shards at "
        "M = 1, 3; the Q4_K dequantize in tests/test_kernels_gguf_gemm.py")
    for m in (1, 3, 40)  # 40 x 2 pairs > 16 x 4 experts: dequantized
    for types in [(GGMLType.Q8_0,) * 3, MIXED]])
def test_gguf_experts_match_the_host_path(m, types) -> None:
    e, h, i = 4, 256, 256
    layer, w13, w2 = _gguf_layer(types, e, h, i)
    g = torch.Generator().manual_seed(m)
    x = torch.randn(m, h, generator=g).to(DEVICE)
    weights, ids = fused_topk(torch.randn(m, e, generator=g).to(DEVICE), 2, True)
    got = layer(x, weights, ids, SiluAndMul())
    want = fused_experts(x.cpu(), w13.cpu(), w2.cpu(), weights.cpu(), ids.long().cpu(),
                         SiluAndMul())
    assert _rel_err(got.cpu(), want) < 1e-4


@gpu
@pytest.mark.parametrize("m", [1, 8, 64, 512])
def test_gguf_experts_qwen3_30b_shapes_bf16(m) -> None:
    """Qwen3-30B-A3B's expert shapes (E 128, hidden 2048, I 768, top-8) as Q4_K_M stores
    them (gate/up Q4_K, down Q6_K): the quantized kernel up to M = 256, dequantized beyond."""
    e, h, i = 128, 2048, 768
    layer, w13, w2 = _gguf_layer((GGMLType.Q4_K, GGMLType.Q4_K, GGMLType.Q6_K), e, h, i)
    x = torch.randn(m, h, device=DEVICE, dtype=torch.bfloat16)
    weights, ids = fused_topk(torch.randn(m, e, device=DEVICE), 8, True)
    got = layer(x, weights, ids, SiluAndMul())
    want = fused_experts(x.float(), w13, w2, weights, ids.long(), SiluAndMul())
    assert _rel_err(got, want) < 2e-2


@pytest.mark.parametrize("case", ["qwen3_moe", "mixtral"])
def test_loader_keeps_gguf_experts_quantized(case, tmp_path) -> None:
    """load_gguf_model(keep_quantized=True) (the CUDA load): FusedMoE gets GGUFExperts with
    the file's blocks, w13/w2 dropped; the block computes what the dense load computes."""
    pytest.importorskip("transformers")
    gguf = pytest.importorskip("gguf")
    from test_gguf_moe import _hf, write_moe_gguf

    from libvllm.engine.model_loader import load_gguf_model

    hf = _hf(case)
    write_moe_gguf(hf, tmp_path / "q8.gguf", expert_type=gguf.GGMLQuantizationType.Q8_0)
    dense, cfg, reader = load_gguf_model(str(tmp_path / "q8.gguf"))
    reader.close()
    quant, _, reader = load_gguf_model(str(tmp_path / "q8.gguf"), keep_quantized=True)
    reader.close()
    moe = quant.model.layers[0].mlp
    assert moe.experts.gguf_experts is not None and moe.experts.w13_weight is None
    assert moe.experts.gguf_experts.w13_types == [GGMLType.Q8_0]
    assert not any("experts.w13" in n or "experts.w2" in n for n, _ in
                   quant.named_parameters())
    h = torch.randn(3, cfg.hidden_size)
    with torch.no_grad():
        want = dense.model.layers[0].mlp(h)
        got = quant.to(DEVICE).model.layers[0].mlp(h.to(DEVICE))
    assert _rel_err(got.cpu(), want) < 1e-4
