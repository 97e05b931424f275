"""kernels/gguf_gemm.py: dequantize, GEMV, fused GEMM and the M dispatch over raw GGUF blocks.

Oracle: engine/gguf/dequant.py dequantize (bit-exact vs the gguf package, see
tests/test_gguf_dequant.py) then an fp32 matmul (gguf_gemm_ref). Inputs: random block bytes
(every bit pattern) with finite fp16 scale fields, as tests/test_gguf_dequant.py builds them.
Mirrors vLLM 0.33 tests/kernels/quantization/test_ggml.py / vllm-gguf-plugin's kernel tests
(dequantize, mul_mat_vec, mul_mat per type against a dequantized reference).
"""

from __future__ import annotations

import pytest
import torch
from test_kernels_common import DEVICE, gpu

from libvllm.engine.errors import InvalidArgumentError, UnsupportedError
from libvllm.engine.gguf.constants import GGML_TYPE_TRAITS, GGMLType
from libvllm.engine.gguf.dequant import (
    dequantize_rows as gguf_dequantize_ref,  # the oracle, per row
)
from libvllm.kernels import gguf_gemm as gguf_gemm_module
from libvllm.kernels.gguf_gemm import gguf_dequantize, gguf_gemm, gguf_gemv, gguf_mmq
from libvllm.kernels.gguf_kquant_mmq import kquant_dequantize, kquant_mmq
from libvllm.kernels.launch_configs import GgufBlocksConfig, GgufMmqConfig, KquantMmqConfig

TYPES = [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0,
         GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K]
# byte offsets of the fp16 scale fields of each block
FP16_FIELDS = {GGMLType.Q4_0: (0,), GGMLType.Q4_1: (0, 2), GGMLType.Q5_0: (0,),
               GGMLType.Q5_1: (0, 2), GGMLType.Q8_0: (0,), GGMLType.Q4_K: (0, 2),
               GGMLType.Q5_K: (0, 2), GGMLType.Q6_K: (208,)}


def random_weight(qtype: GGMLType, n: int, k: int, seed: int = 0) -> torch.Tensor:
    """[n, row_bytes] uint8 of random blocks whose fp16 scales are finite (~N(0, 0.05))."""
    g = torch.Generator().manual_seed(seed)
    block, size = GGML_TYPE_TRAITS[qtype]
    blocks = torch.randint(0, 256, (n * k // block, size), dtype=torch.uint8, generator=g)
    for at in FP16_FIELDS[qtype]:
        scale = (torch.randn(blocks.shape[0], generator=g) * 0.05).half()
        blocks[:, at : at + 2] = scale.view(torch.uint8).view(-1, 2)
    return blocks.view(n, -1).to(DEVICE)


def gguf_gemm_ref(x: torch.Tensor, qweight: torch.Tensor, qtype: int) -> torch.Tensor:
    """fp32 x @ dequantize(W).T, rounded to x's dtype."""
    return (x.float() @ gguf_dequantize_ref(qweight, qtype, torch.float32).T).to(x.dtype)


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30))


@pytest.mark.parametrize("qtype", TYPES)
def test_dequantize_matches_engine(qtype: GGMLType) -> None:
    w = random_weight(qtype, 5, 512 + 256)  # 3 super-blocks / 24 blocks per row
    out = gguf_dequantize(w, qtype, torch.float32)
    # the interpreter does the engine's float ops in its order; GPU code may fuse a mul-add
    assert _rel_err(out, gguf_dequantize_ref(w, qtype, torch.float32)) <= 1e-6


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("m,block_m", [(1, 1), (3, 4)])
def test_gemv_matches_engine(qtype: GGMLType, m: int, block_m: int) -> None:
    w = random_weight(qtype, 19, 512, seed=1)  # 19 rows: a partial BLOCK_N
    x = torch.randn(m, 512, device=DEVICE)
    assert _rel_err(gguf_gemv(x, w, qtype, block_m=block_m), gguf_gemm_ref(x, w, qtype)) < 1e-5


@pytest.mark.parametrize("qtype", TYPES)
def test_mmq_matches_engine(qtype: GGMLType) -> None:
    w = random_weight(qtype, 20, 512, seed=2)
    x = torch.randn(17, 512, device=DEVICE)  # partial BLOCK_M
    y = gguf_mmq(x, w, qtype, config=GgufMmqConfig(16, 16, 4, 2))
    assert _rel_err(y, gguf_gemm_ref(x, w, qtype)) < 1e-5


@pytest.mark.parametrize("k", [32 * 18, 32 * 3])  # SmolLM2's 576; fewer blocks than a step
@pytest.mark.parametrize("qtype", [GGMLType.Q4_1, GGMLType.Q8_0])
def test_rows_that_end_inside_a_step(qtype: GGMLType, k: int) -> None:
    w = random_weight(qtype, 9, k, seed=3)
    x = torch.randn(2, k, device=DEVICE)
    ref = gguf_gemm_ref(x, w, qtype)
    assert _rel_err(gguf_gemv(x, w, qtype, block_m=2), ref) < 1e-5
    assert _rel_err(gguf_mmq(x, w, qtype, config=GgufMmqConfig(16, 16, 4, 2)), ref) < 1e-5
    assert _rel_err(gguf_dequantize(w, qtype, torch.float32), gguf_dequantize_ref(w, qtype,
                    torch.float32)) <= 1e-6


@pytest.mark.parametrize("qtype", [GGMLType.Q4_K, GGMLType.Q6_K])
@pytest.mark.parametrize(("config", "k"), [
    ((16, 16, 4, 1, 1), 768), ((32, 64, 4, 2, 1), 768),
    ((16, 16, 4, 1, 2), 768),  # split-K: planes of 2 and 1 super-blocks
    ((16, 32, 4, 1, 4), 1280),  # 5 super-blocks in 4 splits of 2: the last plane is empty
])
def test_kquant_mmq_matches_engine(qtype: GGMLType, config: tuple, k: int) -> None:
    # 3 or 5 super-blocks a row (Q6_K rows of 630 bytes: every other row off 4-byte
    # alignment), 20 rows and 17 tokens: partial tiles on both sides
    w = random_weight(qtype, 20, k, seed=7)
    x = torch.randn(17, k, device=DEVICE)
    y = kquant_mmq(x, w, qtype, config=KquantMmqConfig(*config))
    assert _rel_err(y, gguf_gemm_ref(x, w, qtype)) < 1e-5


@pytest.mark.parametrize("qtype", [GGMLType.Q4_K, GGMLType.Q6_K])
@pytest.mark.parametrize("config", [(8, 1, 1), (16, 2, 2), (32, 4, 4)])  # rows, blocks, warps
def test_kquant_dequantize_matches_engine(qtype: GGMLType, config: tuple) -> None:
    # 20 rows of 3 super-blocks: partial row tiles, and block groups of 2 / 4 that end past
    # the row (a store past it would land in the next row: the whole tensor is compared)
    w = random_weight(qtype, 20, 768, seed=10)
    out = kquant_dequantize(w, qtype, torch.float32, GgufBlocksConfig(*config))
    assert out.shape == (20, 768)
    assert _rel_err(out, gguf_dequantize_ref(w, qtype, torch.float32)) <= 1e-6


def test_dequantize_takes_the_word_loads_for_aligned_q6_k(monkeypatch) -> None:
    calls = []
    real = gguf_gemm_module.kquant_dequantize
    monkeypatch.setattr(gguf_gemm_module, "kquant_dequantize",
                        lambda *a, **kw: calls.append(a[1]) or real(*a, **kw))
    w = random_weight(GGMLType.Q4_K, 16, 256, seed=11)
    padded = torch.zeros(16, 146, dtype=torch.uint8, device=DEVICE)[:, :144]  # rows 146 apart
    padded.copy_(w)
    for qw, qtype in ((w, GGMLType.Q4_K), (padded, GGMLType.Q4_K),
                      (random_weight(GGMLType.Q6_K, 16, 256), GGMLType.Q6_K),
                      (random_weight(GGMLType.Q5_K, 16, 256), GGMLType.Q5_K)):
        ref = gguf_dequantize_ref(qw, qtype, torch.float32)
        assert _rel_err(gguf_dequantize(qw, qtype, torch.float32), ref) <= 1e-6
    assert calls == [GGMLType.Q6_K]  # kquant_dequant_config: Q6_K only


@pytest.mark.parametrize("qtype", [GGMLType.Q4_K, GGMLType.Q6_K])
def test_kquant_mmq_half_rounds_only_the_weights(qtype: GGMLType) -> None:
    # fp16 (the interpreter's bf16 dot is wrong for every kernel; bf16 runs in the GPU test)
    w = random_weight(qtype, 16, 256, seed=8)
    x = torch.randn(9, 256, device=DEVICE).half()
    ref = x.float() @ gguf_dequantize_ref(w, qtype, torch.float32).half().float().T
    assert _rel_err(kquant_mmq(x, w, qtype, config=KquantMmqConfig(16, 16, 4, 1, 2)), ref) < 1e-3


def test_dispatch_takes_kquant_mmq_only_for_word_aligned_k_quants(monkeypatch) -> None:
    calls = []
    real = gguf_gemm_module.kquant_mmq
    monkeypatch.setattr(gguf_gemm_module, "kquant_mmq",
                        lambda *a, **kw: calls.append(a[2]) or real(*a, **kw))
    x = torch.randn(9, 256, device=DEVICE)
    w = random_weight(GGMLType.Q4_K, 16, 256, seed=9)
    buf = torch.zeros(w.numel() + 2, dtype=torch.uint8, device=DEVICE)
    shifted = buf[2:].view(16, 144)  # 2 bytes off the 4-byte words kquant_mmq loads
    shifted.copy_(w)
    padded = torch.zeros(16, 146, dtype=torch.uint8, device=DEVICE)[:, :144]  # rows 146 apart
    padded.copy_(w)
    for qw, qtype in ((w, GGMLType.Q4_K), (shifted, GGMLType.Q4_K), (padded, GGMLType.Q4_K),
                      (random_weight(GGMLType.Q6_K, 16, 256), GGMLType.Q6_K),
                      (random_weight(GGMLType.Q8_0, 16, 256), GGMLType.Q8_0)):
        assert _rel_err(gguf_gemm(x, qw, qtype), gguf_gemm_ref(x, qw, qtype)) < 1e-5
    assert calls == [GGMLType.Q4_K, GGMLType.Q6_K]
    x40 = torch.randn(40, 256, device=DEVICE)  # past Q6_K's KQUANT_MAX_M, within Q4_K's
    for qw, qtype in ((w, GGMLType.Q4_K), (random_weight(GGMLType.Q6_K, 16, 256), GGMLType.Q6_K)):
        assert _rel_err(gguf_gemm(x40, qw, qtype), gguf_gemm_ref(x40, qw, qtype)) < 1e-5
    assert calls == [GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.Q4_K]
    for bad in (shifted, padded):
        with pytest.raises(InvalidArgumentError, match="aligned to their words"):
            kquant_mmq(x, bad, GGMLType.Q4_K)
    with pytest.raises(InvalidArgumentError, match="do not match"):
        kquant_mmq(torch.randn(9, 512, device=DEVICE), w, GGMLType.Q4_K)


@pytest.mark.parametrize("m", [0, 1, 5, 300])
def test_gemm_dispatch_by_token_count(m: int) -> None:
    w = random_weight(GGMLType.Q4_K, 8, 256, seed=4)
    x = torch.randn(m, 256, device=DEVICE)
    y = gguf_gemm(x, w, GGMLType.Q4_K)
    assert y.shape == (m, 8)
    if m:
        assert _rel_err(y, gguf_gemm_ref(x, w, GGMLType.Q4_K)) < 1e-5


def test_bad_weights_are_rejected_before_launch() -> None:
    w = random_weight(GGMLType.Q4_K, 4, 256)
    x = torch.randn(1, 256, device=DEVICE)
    with pytest.raises(UnsupportedError, match="do not support type Q2_K"):
        gguf_gemv(x, w, GGMLType.Q2_K)
    with pytest.raises(InvalidArgumentError, match="not a whole number of 144-byte blocks"):
        gguf_gemv(x, w[:, :100], GGMLType.Q4_K)
    with pytest.raises(InvalidArgumentError, match=r"x must be \[num_tokens, 256\]"):
        gguf_gemm(torch.randn(1, 512, device=DEVICE), w, GGMLType.Q4_K)
    with pytest.raises(InvalidArgumentError, match="qweight must be"):
        gguf_dequantize(w.view(-1), GGMLType.Q4_K)
    with pytest.raises(InvalidArgumentError, match="qweight must be"):
        gguf_mmq(x, w.float(), GGMLType.Q4_K)


LLAMA_SHAPES = [(14336, 4096), (4096, 14336), (4096, 4096), (1024, 4096)]  # (N, K)


@gpu
@pytest.mark.parametrize("qtype", [GGMLType.Q4_0, GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q6_K])
@pytest.mark.parametrize("n,k", LLAMA_SHAPES)
@pytest.mark.parametrize("m", [1, 4, 16, 32, 48, 64, 512])  # 16 / 32 / 48: kquant splits
def test_llama_shapes_bf16(qtype: GGMLType, n: int, k: int, m: int) -> None:
    w = random_weight(qtype, n, k, seed=5)
    x = torch.randn(m, k, dtype=torch.bfloat16, device=DEVICE)
    ref = (x.float() @ gguf_dequantize_ref(w, qtype, torch.float32).T)
    # bf16 inputs/outputs; the fused GEMM also rounds the weights to bf16
    assert _rel_err(gguf_gemm(x, w, qtype), ref) < 2e-2


@gpu
@pytest.mark.parametrize("qtype", [GGMLType.Q4_K, GGMLType.Q6_K])
def test_kquant_mmq_compiles_once_for_every_m_of_a_config(qtype: GGMLType,
                                                          triton_compiles) -> None:
    """The kernel does not specialize on M (Triton would compile M = 16, 32, 48 apart from
    the M between them: a CUDA graph capture over 8-token buckets compiled twice as many
    variants, about 1.5 s each on the H200)."""
    w = random_weight(qtype, 256, 512, seed=7)
    config = KquantMmqConfig(64, 16, 4, 2, 1)
    kquant_mmq(torch.randn(9, 512, dtype=torch.bfloat16, device=DEVICE), w, qtype, config)
    triton_compiles.clear()
    for m in (1, 15, 16, 32, 33):
        x = torch.randn(m, 512, dtype=torch.bfloat16, device=DEVICE)
        assert _rel_err(kquant_mmq(x, w, qtype, config), gguf_gemm_ref(x.float(), w, qtype)) < 2e-2
    assert triton_compiles == []


@gpu
def test_weights_over_2gb_use_64bit_offsets() -> None:
    # Q8_0 4096-wide rows are 4352 bytes: 500k rows = 2.18 GB > 2^31 bytes (CVE-2026-53923)
    n, k = 500_000, 4096
    w = torch.zeros(n, 4352, dtype=torch.uint8, device=DEVICE)
    tail = random_weight(GGMLType.Q8_0, 64, k, seed=6)
    w[-64:] = tail
    x = torch.randn(1, k, device=DEVICE)
    y = gguf_gemv(x, w, GGMLType.Q8_0)
    assert _rel_err(y[:, -64:], gguf_gemm_ref(x, tail, GGMLType.Q8_0)) < 1e-5
    assert not y[:, :-64].any()
    d = gguf_dequantize(w, GGMLType.Q8_0, torch.bfloat16)
    assert torch.equal(d[-64:], gguf_dequantize_ref(tail, GGMLType.Q8_0, torch.bfloat16))

