"""kernels/gemv.py dense_gemv against F.linear in fp32, and its dispatch from the layers.

Oracle: dense_gemv_ref = F.linear in fp32 rounded to x's dtype. Shapes cover the unmasked
K loop (K % BK == 0), a masked K tail after full steps, N not a multiple of the row block,
bias or none; on CUDA also Llama-3.1-8B's weights (both configs), 64-bit weight offsets,
and ReplicatedLinear / LogitsProcessor taking the kernel for one bf16 row (the
gate_up projection with SiLU-and-mul in its epilogue, gated_mlp). Runs on CUDA or
under the Triton interpreter (tests/test_kernels_common.py).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_kernels_common import DEVICE, ON_CUDA, assert_close, cuda_only, gpu

import libvllm.kernels.gemv
from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.layers.activation import SiluAndMul
from libvllm.engine.layers.linear import (
    MergedColumnParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
    gated_mlp,
)
from libvllm.engine.layers.logits_processor import LogitsProcessor
from libvllm.engine.layers.vocab_parallel_embedding import ParallelLMHead
from libvllm.kernels.activation import silu_and_mul
from libvllm.kernels.gemv import dense_gemv, dense_gemv_config, dense_gemv_ref
from libvllm.kernels.launch_configs import GemvConfig

# bf16 too on CPU: the interpreter truncates to bf16 (1 ulp), inside the bf16 tolerance
ALL_DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _inputs(n: int, k: int, dtype: torch.dtype, bias: bool, seed: int = 0):
    torch.manual_seed(seed)
    x = torch.randn(1, k, dtype=dtype, device=DEVICE)
    w = (torch.randn(n, k, device=DEVICE) / k**0.5).to(dtype)
    b = torch.randn(n, dtype=dtype, device=DEVICE) if bias else None
    return x, w, b


@pytest.mark.parametrize("n", [8, 37, 300])
@pytest.mark.parametrize("k", [64, 100, 1024, 1100])  # EVEN_K, tail only, EVEN_K, full + tail
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("bias", [False, True])
def test_dense_gemv_matches_fp32_linear(n: int, k: int, dtype: torch.dtype, bias: bool) -> None:
    x, w, b = _inputs(n, k, dtype, bias)
    y = dense_gemv(x, w, b)
    assert y.shape == (1, n) and y.dtype == dtype
    assert_close(y, dense_gemv_ref(x, w, b))


# N = 1: a constexpr on CUDA; K = 1100: one masked step of the default 2048 values. 300
# outputs (one a program, 900 programs with the plain GEMV below) only on CUDA
@pytest.mark.parametrize("n,k", [(1, 64), (37, 64), (37, 1100), cuda_only(
    300, 1100, why="(37, 1100): the same one-output programs and masked step, fewer of them")])
# not bf16 under the interpreter: it truncates the rounded SiLU where torch rounds to even
@pytest.mark.parametrize("dtype", ALL_DTYPES if ON_CUDA else ALL_DTYPES[:2])
@pytest.mark.parametrize("bias", [False, True])
def test_dense_gemv_silu_and_mul_matches_the_engine(n: int, k: int, dtype: torch.dtype,
                                                    bias: bool) -> None:
    """The gate_up projection with SiLU-and-mul in its epilogue: w is [2N, K] gate | up."""
    x, w, b = _inputs(2 * n, k, dtype, bias)
    y = dense_gemv(x, w, b, silu_and_mul=True)
    assert y.shape == (1, n) and y.dtype == dtype
    assert_close(y, dense_gemv_ref(x, w, b, silu_and_mul=True))
    # bit for bit the plain GEMV's sums on the same tiles, rounded, then the SiLU-and-mul
    # kernel of M > 1
    plain = dense_gemv(x, w, b, config=dense_gemv_config(2 * n, k, silu_and_mul=True))
    assert torch.equal(y, silu_and_mul(plain))
    with pytest.raises(InvalidArgumentError, match=r"\[2N, K\] gate \| up"):
        dense_gemv(x, w[:-1], silu_and_mul=True)


def test_dense_gemv_silu_and_mul_large_weight_config() -> None:
    """The config of gate_up weights past 8192 rows (8 outputs of 128-wide steps), here on
    a small weight: BN does not divide N, K has a masked tail."""
    x, w, b = _inputs(2 * 37, 300, torch.float32, True, seed=6)
    config = dense_gemv_config(28672, 4096, silu_and_mul=True)
    y = dense_gemv(x, w, b, silu_and_mul=True, config=config)
    assert_close(y, dense_gemv_ref(x, w, b, silu_and_mul=True))
    assert torch.equal(y, silu_and_mul(dense_gemv(x, w, b, config=config)))


def test_dense_gemv_launch_config_override() -> None:
    """A sweep's config (examples/bench/kernels.py --sweep dense) computes the same."""
    x, w, b = _inputs(37, 1100, torch.float32, True)
    for config in (GemvConfig(4, 64, 2, 1), GemvConfig(16, 256, 4, 2)):
        assert_close(dense_gemv(x, w, b, config=config), dense_gemv_ref(x, w, b))


def test_dense_gemv_row_view_and_empty_n() -> None:
    x, w, _ = _inputs(24, 96, torch.float32, False, seed=1)
    rows = torch.randn(3, 96, device=DEVICE)
    assert_close(dense_gemv(rows[1:2], w), dense_gemv_ref(rows[1:2], w))
    assert dense_gemv(x, w[:0]).shape == (1, 0)


def test_dense_gemv_config_rule() -> None:
    assert dense_gemv_config(6144, 4096) == GemvConfig(8, 512, 4, 2)  # qkv
    assert dense_gemv_config(4096, 4096) == GemvConfig(4, 1024, 2, 1)  # o
    assert dense_gemv_config(4096, 14336) == GemvConfig(8, 512, 8, 2)  # down
    assert dense_gemv_config(28672, 4096) == GemvConfig(4, 1024, 2, 1)  # gate_up
    assert dense_gemv_config(28672, 4096, silu_and_mul=True) == GemvConfig(8, 128, 2, 2)  # 8 + 8
    assert dense_gemv_config(1024, 2048, silu_and_mul=True) == GemvConfig(1, 2048, 8, 1)  # shared
    assert dense_gemv_config(128256, 4096) == GemvConfig(16, 256, 4, 2)  # lm_head
    assert dense_gemv_config(300, 100).block_k == 128  # BK shrinks to next_power_of_2(K)


def test_dense_gemv_config_small_n_spreads_a_router_over_many_programs() -> None:
    """Routers of E = 128 (Qwen3-30B-A3B), 256 (Qwen3.5-35B-A3B), 512 (Qwen3-Next), 8
    (Mixtral) and one row (a shared-expert gate): about 128 programs each."""
    assert dense_gemv_config(128, 2048) == GemvConfig(1, 2048, 8, 1)  # Qwen3-30B-A3B
    assert dense_gemv_config(256, 2048) == GemvConfig(2, 1024, 8, 1)  # Qwen3.5-35B-A3B
    assert dense_gemv_config(512, 2048) == GemvConfig(4, 512, 8, 1)  # Qwen3-Next
    assert dense_gemv_config(8, 4096) == GemvConfig(1, 2048, 8, 1)  # Mixtral
    assert dense_gemv_config(1, 2048) == GemvConfig(1, 2048, 8, 1)  # shared_expert_gate
    # E + 1: the router merged with the shared-expert gate (engine/models/qwen3_next.py)
    assert dense_gemv_config(257, 2048) == GemvConfig(2, 1024, 8, 1)  # 129 programs
    assert dense_gemv_config(513, 2048) == GemvConfig(4, 512, 8, 1)  # Qwen3-Next
    assert dense_gemv_config(514, 2048) == GemvConfig(8, 512, 8, 2)  # above: the n < k rule
    x, w, _ = _inputs(300, 3000, torch.float32, False, seed=2)
    assert_close(dense_gemv(x, w), dense_gemv_ref(x, w))  # 4-row blocks, a partial step


@pytest.mark.parametrize("x_shape,w_shape,x_dtype,w_dtype,match", [
    ((16,), (8, 16), torch.float32, torch.float32, r"one row \[1, K\]"),
    ((1, 1, 16), (8, 16), torch.float32, torch.float32, r"one row \[1, K\]"),
    ((2, 16), (8, 16), torch.float32, torch.float32, r"one row \[1, K\]"),
    ((1, 16), (8, 16), torch.int32, torch.int32, "float32, float16 or bfloat16"),
    ((1, 16), (8, 16), torch.float32, torch.float16, "w must be torch.float32 like x"),
    ((1, 16), (8, 12), torch.float32, torch.float32, r"contiguous \[N, 16\]"),
    ((1, 16), (8,), torch.float32, torch.float32, r"contiguous \[N, 16\]"),
    ((1, 0), (8, 0), torch.float32, torch.float32, "K > 0"),
])
def test_dense_gemv_rejects_bad_input(x_shape, w_shape, x_dtype, w_dtype, match) -> None:
    x = torch.zeros(x_shape, dtype=x_dtype, device=DEVICE)
    with pytest.raises(InvalidArgumentError, match=match):
        dense_gemv(x, torch.zeros(w_shape, dtype=w_dtype, device=DEVICE))


def test_dense_gemv_rejects_bad_bias_and_strides() -> None:
    x, w, _ = _inputs(8, 16, torch.float32, False)
    with pytest.raises(InvalidArgumentError, match=r"bias must be a contiguous \[8\]"):
        dense_gemv(x, w, torch.zeros(7, device=DEVICE))
    with pytest.raises(InvalidArgumentError, match=r"bias must be a contiguous \[8\]"):
        dense_gemv(x, w, torch.zeros(8, dtype=torch.float16, device=DEVICE))
    with pytest.raises(InvalidArgumentError, match=r"contiguous \[N, 16\]"):
        dense_gemv(x, torch.zeros(16, 8, device=DEVICE).t())
    with pytest.raises(InvalidArgumentError, match="contiguous last dimension"):
        dense_gemv(torch.zeros(1, 32, device=DEVICE)[:, ::2], w)


@pytest.fixture
def gemv_calls(monkeypatch) -> list[tuple[int, ...]]:
    """Shapes of the x each dense_gemv call got (the layers import it lazily, per call)."""
    calls: list[tuple[int, ...]] = []
    real = libvllm.kernels.gemv.dense_gemv

    def spy(x, w, bias=None, silu_and_mul=False):
        calls.append(tuple(x.shape) + (("silu_and_mul",) if silu_and_mul else ()))
        return real(x, w, bias, silu_and_mul)

    monkeypatch.setattr(libvllm.kernels.gemv, "dense_gemv", spy)
    return calls


@pytest.mark.skipif(ON_CUDA, reason="the CPU path")
def test_layers_use_f_linear_off_cuda(gemv_calls) -> None:
    lin = ReplicatedLinear(16, 8, bias=True)
    lin.weight.data.normal_()
    lin.bias.data.normal_()
    x = torch.randn(1, 16)
    torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias), rtol=0, atol=0)
    assert gemv_calls == []


@gpu
@pytest.mark.parametrize("n,k", [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336),
                                 (128256, 4096), (1000, 4000)])
@pytest.mark.parametrize("bias", [False, True])
def test_dense_gemv_llama_shapes_bf16(n: int, k: int, bias: bool) -> None:
    x, w, b = _inputs(n, k, torch.bfloat16, bias, seed=2)
    assert_close(dense_gemv(x, w, b), dense_gemv_ref(x, w, b))


@gpu
def test_dense_gemv_64bit_offsets() -> None:
    # 524_352 rows of 4096 bf16 = 2^31 + 2^18 elements: the last rows start past 2^31
    n, k = 524_352, 4096
    w = torch.zeros(n, k, dtype=torch.bfloat16, device=DEVICE)
    x, tail, _ = _inputs(64, k, torch.bfloat16, False, seed=3)
    w[-64:] = tail
    y = dense_gemv(x, w)
    assert_close(y[:, -64:], dense_gemv_ref(x, tail))
    assert not y[:, :-64].any()
    del w


@gpu
def test_layers_take_the_gemv_for_one_bf16_row(gemv_calls) -> None:
    torch.manual_seed(4)
    lin = ReplicatedLinear(4096, 6144, bias=True).to(DEVICE, torch.bfloat16)
    lin.weight.data.normal_(std=4096**-0.5)
    lin.bias.data.normal_()
    for rows in (1, 2):
        x = torch.randn(rows, 4096, dtype=torch.bfloat16, device=DEVICE)
        assert_close(lin(x), F.linear(x, lin.weight, lin.bias))
    head = ParallelLMHead(1000, 4096).to(DEVICE, torch.bfloat16)
    head.weight.data.normal_(std=4096**-0.5)
    h = torch.randn(1, 4096, dtype=torch.bfloat16, device=DEVICE)
    logits = LogitsProcessor(1000)(head, h)
    assert logits.dtype == torch.float32
    assert_close(logits.bfloat16(), F.linear(h, head.weight))
    assert gemv_calls == [(1, 4096), (1, 4096)]  # the 2-row input stays on cuBLAS


@gpu
def test_gated_mlp_takes_silu_and_mul_into_the_gate_up_gemv(gemv_calls) -> None:
    torch.manual_seed(5)
    gate_up = MergedColumnParallelLinear(4096, [14336] * 2).to(DEVICE, torch.bfloat16)
    down = RowParallelLinear(14336, 4096).to(DEVICE, torch.bfloat16)
    gate_up.weight.data.normal_(std=4096**-0.5)
    down.weight.data.normal_(std=14336**-0.5)
    act = SiluAndMul()
    for rows in (1, 2):
        x = torch.randn(rows, 4096, dtype=torch.bfloat16, device=DEVICE)
        assert_close(gated_mlp(x, gate_up, down, act),
                     F.linear(act.forward_native(F.linear(x, gate_up.weight)), down.weight))
    # one row: gate_up with the activation, then the plain down GEMV; 2 rows: cuBLAS
    assert gemv_calls == [(1, 4096, "silu_and_mul"), (1, 14336)]
