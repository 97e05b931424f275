"""kernels/gguf_mmvq.py: q8_1 activation quantization and the int8-dot GGUF decode GEMV.

Mirrors vLLM 0.33 tests/kernels/quantization/test_ggml.py (test_mmvq: ggml_mul_mat_vec_a8
per type against a dequantized fp32 reference, loose tolerance for the int8 activations).
Oracles: engine/gguf/dequant.py (the per-row dequantize, bit-exact vs the gguf package) with
an fp32 matmul, and quantize_q8_1_ref (torch) for the activations. With activations that are
small integers with 127 in every group of 32 the q8_1 form is exact, so the GEMV must equal
the fp32 reference to rounding; with random activations it must stay within the int8
rounding error.
"""

from __future__ import annotations

import pytest
import torch
from test_kernels_common import DEVICE, cuda_only
from test_kernels_gguf_gemm import gguf_gemm_ref, random_weight

from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.gguf.constants import GGMLType
from libvllm.kernels.activation import silu_and_mul
from libvllm.kernels.gguf_mmvq import (
    MMVQ_MAX_M,
    gguf_mmvq,
    gguf_mmvq_q8_1,
    mmvq_config,
    quantize_q8_1,
    quantize_q8_1_ref,
)
from libvllm.kernels.launch_configs import MmvqConfig

TYPES = [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q5_K,
         GGMLType.Q6_K]
# Weight rows of the exact checks: BLOCK_N + 1, two programs, the last one partial for a
# BLOCK_N of 2, 4 and 8 (its rows past N masked, or re-reading row N - 1); Q6_K's odd rows
# start 2 bytes into a word. The interpreter's time is about proportional to the programs
# run (13 rows, a partial block for every BLOCK_N at once, took up to 13 programs).
def rows_for(block_n: int) -> int:
    return block_n + 1


def _unpack(xq: torch.Tensor) -> torch.Tensor:
    """int32 words [M, K / 4] -> int8 values [M, K] (little-endian bytes)."""
    return xq.cpu().view(torch.int8).reshape(xq.shape[0], -1)


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def _integer_x(m: int, k: int, seed: int = 0) -> torch.Tensor:
    """Integers in [-127, 127], one +-127 per group of 32: q8_1 holds them exactly (d = 1)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-127, 128, (m, k), generator=g).float()
    x.view(m, -1, 32)[:, :, 5] = torch.where(torch.rand(m, k // 32, generator=g) < 0.5, -127.0,
                                             127.0)
    return x.to(DEVICE)


@pytest.mark.parametrize("silu", [False, True])
def test_quantize_q8_1_matches_reference(silu: bool) -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 2 * 640 if silu else 640, device=DEVICE) * 3
    x[1, :32] = 0.0  # an all-zero group: d = 0, q = 0
    xq, xd, xs = quantize_q8_1(x, silu_and_mul=silu)
    # the activation as kernels/activation.py computes it (one formula; torch's F.silu may
    # differ in the last bit, which can move a value across a rounding boundary)
    q_ref, d_ref, s_ref = quantize_q8_1_ref(silu_and_mul(x) if silu else x)
    # the GPU may fuse x * (127 / amax) + 1.5 * 2^23 into one FMA (one rounding, torch has
    # two): a value that lands on .5 can then round the other way, by one
    diff = (_unpack(xq).int() - q_ref.cpu().int()).abs()
    assert int(diff.max()) <= 1 and int(diff.sum()) <= (0 if DEVICE == "cpu" else 8)
    assert torch.equal(xd.cpu(), d_ref.cpu())
    torch.testing.assert_close(xs.cpu(), s_ref.cpu(), rtol=1e-5, atol=1e-5)
    assert float(xd[1, 0]) == 0.0 and not _unpack(xq)[1, :32].any()


@pytest.mark.parametrize("qtype,m", [
    (t, m) if (t, m) != (GGMLType.Q6_K, 3) else cuda_only(
        t, m, why="Q6_K's token loop at M = 6, on whole and masked steps, in "
        "test_mmvq_default_configs_exact_on_integer_activations")
    for t in TYPES for m in (1, 3)] + [(GGMLType.Q4_K, MMVQ_MAX_M)])
def test_mmvq_exact_on_integer_activations(qtype: GGMLType, m: int) -> None:
    """3 super-blocks / 24 blocks a row (not a whole number of steps), rows_for the default
    config's BLOCK_N (a partial row block), M tokens padded to a power of two (the same code
    for every M per type)."""
    k = 768
    w = random_weight(qtype, rows_for(mmvq_config(qtype, 1).block_n), k, seed=int(qtype))
    x = _integer_x(m, k, seed=m)
    ref = gguf_gemm_ref(x.double().float(), w, qtype)
    assert _rel_err(gguf_mmvq(x, w, qtype), ref) < 1e-5


@pytest.mark.parametrize("qtype", TYPES)
def test_mmvq_within_int8_error_on_random_activations(qtype: GGMLType) -> None:
    w = random_weight(qtype, 16, 512, seed=7)
    x = torch.randn(2, 512, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    err = _rel_err(gguf_mmvq(x, w, qtype), gguf_gemm_ref(x, w, qtype))
    assert err < 2e-2  # int8 activations: ~1/254 of each group's max per value
    x8 = quantize_q8_1_ref(x)
    xdq = (x8[0].float().view(2, -1, 32) * x8[1][..., None].float()).view(2, -1)
    assert err < 3 * _rel_err(gguf_gemm_ref(xdq, w, qtype), gguf_gemm_ref(x, w, qtype))


def test_mmvq_silu_and_mul_and_output_slice() -> None:
    """The down projection's fused activation; shards written into one wider output."""
    qtype = GGMLType.Q4_K
    gate_up = torch.randn(2, 2 * 512, generator=torch.Generator().manual_seed(2)).to(
        DEVICE, torch.bfloat16)
    w = random_weight(qtype, 4, 512, seed=3)  # 2 programs of the default 2 rows
    y = gguf_mmvq(gate_up, w, qtype, silu_and_mul=True)
    assert y.dtype == torch.bfloat16
    act = silu_and_mul(gate_up)  # rounded as the fused kernel rounds
    assert torch.equal(y, gguf_mmvq(act, w, qtype))
    out = torch.zeros(2, 12, device=DEVICE, dtype=torch.bfloat16)
    gguf_mmvq_q8_1(quantize_q8_1(act), w, qtype, out[:, 4:8])
    assert torch.equal(out[:, 4:8], y) and not out[:, :4].any() and not out[:, 8:].any()


def test_mmvq_rejects_bad_input() -> None:
    w = random_weight(GGMLType.Q4_K, 4, 512)
    x = torch.randn(1, 512, device=DEVICE)
    with pytest.raises(InvalidArgumentError, match="no int8 GEMV"):
        gguf_mmvq(x, w, GGMLType.Q5_0)
    with pytest.raises(InvalidArgumentError, match="does not match K"):
        gguf_mmvq(torch.randn(1, 256, device=DEVICE), w, GGMLType.Q4_K)
    with pytest.raises(InvalidArgumentError, match="more than"):
        gguf_mmvq(torch.randn(MMVQ_MAX_M + 1, 512, device=DEVICE), w, GGMLType.Q4_K)
    with pytest.raises(InvalidArgumentError, match="whole 144-byte blocks"):
        gguf_mmvq(x, w[:, :100], GGMLType.Q4_K)
    with pytest.raises(InvalidArgumentError, match="multiple of 32"):
        quantize_q8_1(torch.randn(1, 40, device=DEVICE))
    with pytest.raises(InvalidArgumentError, match="2K"):
        quantize_q8_1(torch.randn(1, 65, device=DEVICE), silu_and_mul=True)
    xq, xd, xs = quantize_q8_1(x)
    with pytest.raises(InvalidArgumentError, match="quantize_q8_1's"):
        gguf_mmvq_q8_1((xq, xd.half(), xs), w, GGMLType.Q4_K, torch.empty(1, 4, device=DEVICE))


def test_gguf_weight_shards_share_one_quantization() -> None:
    """engine/layers/linear.py GGUFWeight: up to MMVQ_MAX_M tokens, int8-dot shards (Q4_K,
    Q6_K) and a shard of another type (Q5_0, kernels/gguf_gemm.py) fill one output; the
    down projection's SiLU-and-mul goes into the quantization (forward_act_and_mul)."""
    from libvllm.engine.layers.activation import SiluAndMul
    from libvllm.engine.layers.linear import GGUFWeight, ReplicatedLinear

    types = [GGMLType.Q4_K, GGMLType.Q5_0, GGMLType.Q6_K]
    shards = [(random_weight(t, n, 256, seed=i), t) for i, (t, n) in enumerate(zip(types,
                                                                                   [4, 4, 2]))]
    gw = GGUFWeight(shards)
    gen = torch.Generator().manual_seed(3)
    for m in (2, MMVQ_MAX_M + 1):  # the int8 GEMV, then kernels/gguf_gemm.py for all
        x = torch.randn(m, 256, generator=gen).to(DEVICE)
        ref = torch.cat([gguf_gemm_ref(x, w, t) for w, t in shards], dim=1)
        assert _rel_err(gw(x), ref) < 2e-2
        gate_up = torch.randn(m, 512, generator=gen).to(DEVICE, torch.bfloat16)
        # the activation fused into the quantization (int8-dot shards) or made first (Q5_0)
        assert torch.equal(gw(gate_up, silu_and_mul=True), gw(silu_and_mul(gate_up)))
    down = ReplicatedLinear(256, 8)
    down.weight = None
    down.gguf_weight = GGUFWeight([(random_weight(GGMLType.Q4_K, 8, 256, seed=5),
                                    GGMLType.Q4_K)])
    gate_up = torch.randn(1, 512, generator=gen).to(DEVICE, torch.bfloat16)  # as a model's
    got = down.forward_act_and_mul(gate_up, SiluAndMul())  # bf16 rounding: one activation
    assert torch.equal(got, down.gguf_weight(silu_and_mul(gate_up)))


LAYOUTS = [
    (GGMLType.Q4_K, (2, 4, 1, 0)), (GGMLType.Q4_K, (4, 2, 1, 1)), (GGMLType.Q4_K, (8, 2, 2, 1)),
    (GGMLType.Q5_K, (2, 4, 1, 0)), (GGMLType.Q5_K, (2, 2, 1, 1)), (GGMLType.Q6_K, (2, 2, 1, 0)),
    (GGMLType.Q6_K, (8, 1, 1, 1)), (GGMLType.Q6_K, (4, 4, 2, 1)), (GGMLType.Q8_0, (1, 32, 1, 0)),
    (GGMLType.Q8_0, (2, 16, 1, 1)), (GGMLType.Q8_0, (1, 64, 2, 1)), (GGMLType.Q4_0, (1, 32, 1, 0)),
    (GGMLType.Q4_0, (4, 16, 1, 1)), (GGMLType.Q4_1, (1, 32, 1, 0)), (GGMLType.Q4_1, (2, 16, 1, 1)),
    (GGMLType.Q4_K, (2, 4, 1, 2)), (GGMLType.Q6_K, (1, 8, 1, 2)), (GGMLType.Q8_0, (1, 64, 1, 2))]
# Why a layout's M = 3 case (BLOCK_M = 4: the token loop) runs on CUDA only; on CPU every
# layout runs at M = 1, and each type and layout at M > 1 in one case at least.
_STEPS_AT_M6 = ("{}'s whole and masked steps at M = 6 in "
                "test_mmvq_default_configs_exact_on_integer_activations")
_DEFAULT = "the default config: test_mmvq_exact_on_integer_activations"
_LAYOUT2 = "layout 2 changes the weight loads only, outside the token loop (M = 1 on CPU)"
_M3_ON_CUDA = {
    (GGMLType.Q4_K, (8, 2, 2, 1)): "(4, 2, 1, 1)'s steps (BLOCK_N, warps differ)",
    (GGMLType.Q5_K, (2, 2, 1, 1)): "(4, 2, 1, 1)'s Q4_K steps, Q5_K's bits at M = 3 in "
                                   "test_mmvq_exact_on_integer_activations",
    (GGMLType.Q6_K, (8, 1, 1, 1)): _STEPS_AT_M6.format("Q6_K"),
    (GGMLType.Q6_K, (4, 4, 2, 1)): _STEPS_AT_M6.format("Q6_K"),
    (GGMLType.Q8_0, (2, 16, 1, 1)): _STEPS_AT_M6.format("Q8_0"),
    (GGMLType.Q8_0, (1, 64, 2, 1)): _STEPS_AT_M6.format("Q8_0"),
    (GGMLType.Q4_0, (1, 32, 1, 0)): _DEFAULT,
    (GGMLType.Q4_1, (1, 32, 1, 0)): _DEFAULT,
    (GGMLType.Q4_K, (2, 4, 1, 2)): _LAYOUT2,
    (GGMLType.Q6_K, (1, 8, 1, 2)): _LAYOUT2,
    (GGMLType.Q8_0, (1, 64, 1, 2)): _LAYOUT2,
}


@pytest.mark.parametrize("qtype,config,m", [
    *[(t, c, 1) for t, c in LAYOUTS],
    *[cuda_only(t, c, 3, why=_M3_ON_CUDA[t, c]) if (t, c) in _M3_ON_CUDA else (t, c, 3)
      for t, c in LAYOUTS]])
def test_mmvq_layouts_exact_on_integer_activations(qtype: GGMLType, config: tuple, m: int
                                                   ) -> None:
    """Every layout (MmvqConfig.layout: 0 the first kernels, 1 kernels/gguf_mmvq_lanes.py, 2 the
    same reading weights past L1) and
    step shape the bench sweeps: 3 super-blocks / 24 blocks a row (whole steps, then a
    masked one, or a masked one only; Q6_K's 630-byte rows alternate 4-byte phases, Q8_0
    and Q4_0 blocks alternate within a row), rows_for BLOCK_N (the last program's rows past
    N re-read row N - 1)."""
    k = 768
    w = random_weight(qtype, rows_for(config[0]), k, seed=int(qtype))
    x = _integer_x(m, k, seed=m)
    ref = gguf_gemm_ref(x.double().float(), w, qtype)
    assert _rel_err(gguf_mmvq(x, w, qtype, config=MmvqConfig(*config)), ref) < 1e-5


@pytest.mark.parametrize("qtype,k,config,rows,m", [  # mmvq_config's Q6_K / Q8_0 defaults
    (GGMLType.Q8_0, 32 * 97, (1, 64, 1, 1), 3, 1),  # whole steps, then a masked one; an odd
    (GGMLType.Q8_0, 32 * 97, (2, 32, 1, 1), 3, 6),  # block count (2-byte phases); 8-row tiles
    (GGMLType.Q6_K, 256 * 9, (1, 8, 1, 1), 3, 1),
    cuda_only(GGMLType.Q6_K, 256 * 9, (2, 4, 1, 1), 3, 6,
              why="the (4, 4, 1, 1) case below (BLOCK_N differs)"),
    (GGMLType.Q6_K, 256 * 9, (4, 4, 1, 1), 5, 6)])  # rows past N re-read row N - 1
def test_mmvq_default_configs_exact_on_integer_activations(qtype: GGMLType, k: int,
                                                           config: tuple, rows: int, m: int
                                                           ) -> None:
    """The same check for each default config on rows of several whole steps."""
    w = random_weight(qtype, rows, k, seed=1)
    x = _integer_x(m, k, seed=2)
    ref = gguf_gemm_ref(x.double().float(), w, qtype)
    assert _rel_err(gguf_mmvq(x, w, qtype, config=MmvqConfig(*config)), ref) < 1e-5


def test_mmvq_q6_k_weight_view_off_4_byte_alignment() -> None:
    """Layout 1 reads Q6_K's 2-byte aligned blocks as aligned words; a weight view that
    starts 2 bytes into a word goes through layout 0, same result."""
    qtype, k = GGMLType.Q6_K, 512
    w = random_weight(qtype, 6, k, seed=4)
    flat = torch.zeros(w.numel() + 2, dtype=torch.uint8, device=w.device)
    flat[2:] = w.reshape(-1)
    view = flat[2:].view(w.shape)
    assert view.data_ptr() % 4 == 2
    x = _integer_x(1, k)
    lanes = MmvqConfig(2, 4, 1, 1)  # layout 1
    words = MmvqConfig(2, 4, 1, 0)
    assert torch.equal(gguf_mmvq(x, view, qtype, config=lanes),
                       gguf_mmvq(x, w, qtype, config=words))


def test_mmvq_config_defaults() -> None:
    """mmvq_config's rule (its docstring): layout 1 for the K-quants and Q8_0, more rows a
    program for wide layers, fewer for narrow ones; layout 0 for Q4_0 / Q4_1."""
    assert mmvq_config(GGMLType.Q4_K, 28672) == MmvqConfig(4, 4, 1, 1)
    assert mmvq_config(GGMLType.Q4_K, 6144) == MmvqConfig(4, 4, 1, 1)
    assert mmvq_config(GGMLType.Q4_K, 4096) == MmvqConfig(2, 4, 1, 1)
    assert mmvq_config(GGMLType.Q5_K, 1024) == MmvqConfig(2, 4, 1, 1)
    assert mmvq_config(GGMLType.Q6_K, 128256) == MmvqConfig(4, 4, 1, 1)
    assert mmvq_config(GGMLType.Q6_K, 4096) == MmvqConfig(2, 4, 1, 1)
    assert mmvq_config(GGMLType.Q6_K, 1024) == MmvqConfig(1, 8, 1, 1)
    assert mmvq_config(GGMLType.Q8_0, 28672) == MmvqConfig(2, 32, 1, 1)
    assert mmvq_config(GGMLType.Q8_0, 6144) == MmvqConfig(1, 64, 1, 1)
    assert mmvq_config(GGMLType.Q8_0, 4096) == MmvqConfig(1, 64, 1, 1)
    assert mmvq_config(GGMLType.Q4_1, 4096) == MmvqConfig(1, 32, 1, 0)
