"""kernels/gguf_repack.py + kernels/gguf_packed.py: repacked GGUF planes, decode GEMV, dequantize.

Oracle: engine/gguf/dequant.py dequantize of the raw blocks (bit-exact vs the gguf package,
tests/test_gguf_dequant.py), then an fp32 matmul (kernels/gguf_gemm.py gguf_gemm_ref).
Inputs: random block bytes (every bit pattern) with finite fp16 scale fields, as
tests/test_kernels_gguf_gemm.py builds them. Mirrors vLLM 0.33
tests/kernels/quantization/test_ggml.py (dequantize and mul_mat_vec per type against a
dequantized reference), for the load-time repacked layout.
"""

from __future__ import annotations

import pytest
import torch
from test_kernels_common import DEVICE, gpu
from test_kernels_gguf_gemm import random_weight

from engine.errors import InvalidArgumentError, UnsupportedError
from engine.gguf.constants import GGMLType
from engine.layers.activation import SiluAndMul
from kernels.gguf_gemm import gguf_dequantize_ref, gguf_gemm_ref
from kernels.gguf_packed import (
    gguf_packed_dequantize,
    gguf_packed_gemv,
    gguf_packed_linear,
)
from kernels.gguf_repack import PackedGGUF, repack

TYPES = [GGMLType.Q4_0, GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K]


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30))


@pytest.mark.parametrize("qtype", TYPES)
def test_repack_round_trip_is_exact(qtype: GGMLType) -> None:
    w = random_weight(qtype, 5, 512 + 256)  # 3 super-blocks / 24 blocks per row
    pw = repack(w, qtype, chunk_rows=2)  # several chunks
    assert pw.shape == (5, 768)
    out = gguf_packed_dequantize(pw, torch.float32)
    assert torch.equal(out, gguf_dequantize_ref(w, qtype, torch.float32))


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("m", [1, 3, 8])
def test_gemv_matches_reference(qtype: GGMLType, m: int) -> None:
    w = random_weight(qtype, 19, 512, seed=1)  # 19 rows: a partial BLOCK_N
    x = torch.randn(m, 512, device=DEVICE)
    y = gguf_packed_gemv(x, repack(w, qtype))
    assert y.shape == (m, 19)
    assert _rel_err(y, gguf_gemm_ref(x, w, qtype)) < 1e-5


@pytest.mark.parametrize("prefetch", [True, False])
@pytest.mark.parametrize("qtype", [GGMLType.Q4_K, GGMLType.Q6_K])
def test_gemv_fp16_bias_and_partial_steps(qtype: GGMLType, prefetch: bool) -> None:
    w = random_weight(qtype, 7, 256 * 3, seed=2)
    pw = repack(w, qtype)
    x = torch.randn(2, 768, device=DEVICE).half()
    bias = torch.randn(7, device=DEVICE).half()
    ref = (x.float() @ gguf_dequantize_ref(w, qtype, torch.float32).T + bias.float())
    y = gguf_packed_gemv(x, pw, bias, config=(2, 16, 1, prefetch))  # 24 groups: partial
    assert y.dtype == torch.float16
    assert _rel_err(y, ref) < 2e-3


@pytest.mark.parametrize("qtype", [GGMLType.Q4_K, GGMLType.Q8_0])
def test_gemv_silu_and_mul(qtype: GGMLType) -> None:
    w = random_weight(qtype, 9, 256, seed=3)
    gate_up = torch.randn(3, 512, device=DEVICE)
    ref = gguf_gemm_ref(SiluAndMul().forward_native(gate_up), w, qtype)
    y = gguf_packed_gemv(gate_up, repack(w, qtype), silu_and_mul=True)
    assert _rel_err(y, ref) < 1e-5


def test_linear_dispatch_by_token_count_and_out_slices() -> None:
    w = random_weight(GGMLType.Q4_0, 6, 64, seed=4)
    pw = repack(w, GGMLType.Q4_0)
    for m in (0, 1, 9):  # GEMV, GEMV, dequantize + matmul
        x = torch.randn(m, 64, device=DEVICE)
        y = torch.zeros(m, 10, device=DEVICE)
        gguf_packed_linear(x, pw, out=y[:, 2:8])
        if m:
            assert _rel_err(y[:, 2:8], gguf_gemm_ref(x, w, GGMLType.Q4_0)) < 1e-5
        assert not y[:, :2].any() and not y[:, 8:].any()


def test_bad_arguments_are_rejected() -> None:
    w = random_weight(GGMLType.Q4_K, 4, 256)
    pw = repack(w, GGMLType.Q4_K)
    x = torch.randn(1, 256, device=DEVICE)
    with pytest.raises(UnsupportedError, match="no packed GGUF layout"):
        repack(w, GGMLType.Q4_1)
    with pytest.raises(InvalidArgumentError, match="whole 144-byte blocks"):
        repack(w[:, :100], GGMLType.Q4_K)
    with pytest.raises(InvalidArgumentError, match=r"x must be \[num_tokens, 256\]"):
        gguf_packed_gemv(torch.randn(1, 512, device=DEVICE), pw)
    with pytest.raises(InvalidArgumentError, match="at most 8 rows"):
        gguf_packed_gemv(torch.randn(9, 256, device=DEVICE), pw)
    with pytest.raises(InvalidArgumentError, match=r"sc must be a contiguous \[4, 8\]"):
        gguf_packed_gemv(x, pw._replace(sc=pw.sc[:, :4]))
    with pytest.raises(InvalidArgumentError, match="d must be"):
        gguf_packed_dequantize(pw._replace(d=None))
    with pytest.raises(InvalidArgumentError, match="qs must be"):
        gguf_packed_dequantize(PackedGGUF(GGMLType.Q4_K, pw.qs[:, :12].contiguous(), None,
                                          pw.sc, pw.d))
    with pytest.raises(InvalidArgumentError, match="bias must be"):
        gguf_packed_gemv(x, pw, torch.zeros(3, device=DEVICE))


LLAMA_SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]  # (N, K)


@gpu
@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("n,k", LLAMA_SHAPES)
@pytest.mark.parametrize("m", [1, 4, 8, 64])
def test_llama_shapes_bf16(qtype: GGMLType, n: int, k: int, m: int) -> None:
    w = random_weight(qtype, n, k, seed=5)
    pw = repack(w, qtype)
    assert torch.equal(gguf_packed_dequantize(pw, torch.float32),
                       gguf_dequantize_ref(w, qtype, torch.float32))
    x = torch.randn(m, k, dtype=torch.bfloat16, device=DEVICE)
    ref = x.float() @ gguf_dequantize_ref(w, qtype, torch.float32).T
    assert _rel_err(gguf_packed_linear(x, pw), ref) < 2e-2


@gpu
def test_weights_over_2gb_use_64bit_offsets() -> None:
    # Q8_0 [600k, 4096]: the qs plane is 2.46 GB > 2^31 bytes (CVE-2026-53923)
    n, k = 600_000, 4096
    tail = random_weight(GGMLType.Q8_0, 64, k, seed=6)
    pw = repack(torch.cat([torch.zeros(n - 64, 4352, dtype=torch.uint8, device=DEVICE),
                           tail]), GGMLType.Q8_0, chunk_rows=1 << 16)
    x = torch.randn(1, k, device=DEVICE)
    y = gguf_packed_gemv(x, pw)
    assert _rel_err(y[:, -64:], gguf_gemm_ref(x, tail, GGMLType.Q8_0)) < 1e-5
    assert not y[:, :-64].any()


def test_gguf_weight_repacks_its_shards_and_fuses_bias_and_silu() -> None:
    # engine/layers/linear.py GGUFWeight: packed and raw shards side by side (qkv-like),
    # the bias into the GEMV, SiLU-and-mul of a down projection inside it for <= 8 rows
    from engine.layers.linear import GGUFWeight, ReplicatedLinear

    shards = [(random_weight(GGMLType.Q8_0, 6, 256, seed=7), GGMLType.Q8_0),
              (random_weight(GGMLType.Q4_1, 5, 256, seed=8), GGMLType.Q4_1),
              (random_weight(GGMLType.Q6_K, 7, 256, seed=9), GGMLType.Q6_K)]
    dense = torch.cat([gguf_dequantize_ref(w, t, torch.float32) for w, t in shards])
    gw = GGUFWeight(shards)
    gw.repack_shards()
    assert gw.packed(0) is not None and gw.packed(1) is None and gw.packed(2) is not None
    assert {"qweight0", "qweight2"}.isdisjoint(dict(gw.named_buffers()))
    bias = torch.randn(18, device=DEVICE)
    for m in (1, 3, 9):
        x = torch.randn(m, 256, device=DEVICE)
        assert _rel_err(gw(x, bias), x @ dense.T + bias) < 1e-5
    down = ReplicatedLinear(256, 9)
    w = random_weight(GGMLType.Q4_K, 9, 256, seed=10)
    down.gguf_weight = GGUFWeight([(w, GGMLType.Q4_K)])
    down.gguf_weight.repack_shards()
    dense = gguf_dequantize_ref(w, GGMLType.Q4_K, torch.float32)
    for m in (2, 9):  # fused, then SiluAndMul + dequantize + matmul
        gate_up = torch.randn(m, 512, device=DEVICE)
        assert down.gguf_weight.fuses_silu_and_mul(gate_up) == (m <= 8)
        ref = SiluAndMul().forward_native(gate_up) @ dense.T
        assert _rel_err(down.forward_act_and_mul(gate_up, SiluAndMul()), ref) < 1e-5
