"""kernels/fused_moe_gemv_fp8.py (the decode GEMV pair of block-FP8 experts) against its
torch reference of the same quantized math and against the FP8 fused_moe_kernel path, and
fused_experts_triton's (and Fp8MoEMethod.apply's) choice of it.

Mirrors vLLM 0.33 tests/kernels/moe/test_block_fp8.py (test_w8a8_block_fp8_fused_moe:
fused_experts with use_fp8_w8a8 and block_shape against torch_w8a8_block_fp8_moe, the
dequantized oracle with per-token-group activation quantization) for the sparse decode
regime (M * top_k * 4 <= E). The CPU engine never runs these kernels (Fp8MoEMethod
dequantizes FP8 experts at load and the host path runs torch experts), so the dispatch is
tested on fused_experts_triton and Fp8MoEMethod.apply directly. On CPU under the Triton
interpreter (E 4..8, H = I = 256, top-2, M 1..3, [128, 128] blocks; the activation
quantization in torch there: tests/test_kernels_fp8_moe.py's fixture says why);
Qwen3.5-35B-A3B's experts (E 256, H 2048, I 512, top-8) on CUDA with FP8 (sm_89+).
"""

from __future__ import annotations

import types

import pytest
import torch
from test_kernels_common import (
    DEVICE,
    ON_CUDA,
    capture,
    cuda_only,
    gpu,
    run_without_host_sync,
)
from test_kernels_fp8_moe import quantize_weight

import libvllm.kernels.fused_moe_gemv_fp8 as moe_gemv_fp8
from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.layers.activation import SiluAndMul
from libvllm.engine.layers.fused_moe import fused_experts_triton, fused_topk
from libvllm.engine.layers.quantization.base_config import WeightScheme
from libvllm.engine.layers.quantization.fp8 import Fp8MoEMethod
from libvllm.kernels import fused_moe
from libvllm.kernels.fp8_quant import (
    dequantize_fp8,
    per_token_group_quant_fp8_ref,
    scaled_fp8_quant_ref,
)
from libvllm.kernels.fused_moe_gemv_fp8 import (
    fused_moe_gemv_fp8,
    fused_moe_gemv_fp8_config,
    fused_moe_gemv_fp8_ref,
    fused_moe_gemv_fp8_w2,
    fused_moe_gemv_fp8_w13,
)
from libvllm.kernels.launch_configs import GemvConfig

if ON_CUDA and torch.cuda.get_device_capability() < (8, 9):
    pytest.skip("the FP8 kernels need an sm_89+ GPU", allow_module_level=True)
BLOCK = [128, 128]
DTYPES = [torch.bfloat16, torch.float16] if ON_CUDA else [torch.float32, torch.float16]


@pytest.fixture(autouse=True)
def torch_quant_under_interpreter(monkeypatch):
    """Under the interpreter both paths quantize activations with the torch reference (the
    interpreter's fp32 -> fp8 store halves values that round up to a power of two)."""
    if not ON_CUDA:
        monkeypatch.setattr(moe_gemv_fp8, "per_token_group_quant_fp8",
                            per_token_group_quant_fp8_ref)
        monkeypatch.setattr(fused_moe, "per_token_group_quant_fp8",
                            per_token_group_quant_fp8_ref)
        monkeypatch.setattr(fused_moe, "scaled_fp8_quant", lambda a, s, **kw: (
            scaled_fp8_quant_ref(a, s, **kw)))


def experts(m, e, h, i, topk, dtype, block=BLOCK, seed=0):
    """x [m, h] dtype, fp8 w13 [e, 2i, h] / w2 [e, h, i] with their block scales, fused_topk's
    weights and int32 ids of random logits (made on the device: real sizes are GBs)."""
    g = torch.Generator(DEVICE).manual_seed(seed)
    x = torch.randn(m, h, generator=g, device=DEVICE).to(dtype)
    w13_q, w13_s = quantize_weight(torch.randn(e, 2 * i, h, generator=g, device=DEVICE)
                                   / h**0.5, "block", block)
    w2_q, w2_s = quantize_weight(torch.randn(e, h, i, generator=g, device=DEVICE) / i**0.5,
                                 "block", block)
    weights, ids = fused_topk(torch.randn(m, e, generator=g, device=DEVICE), topk, True)
    return x, w13_q, w13_s, w2_q, w2_s, weights, ids


def assert_fp8_close(out: torch.Tensor, ref: torch.Tensor, rtol: float) -> None:
    """Relative to the output's scale: fp32 sums in another order, and an activation near an
    fp8 rounding boundary may land one fp8 step apart."""
    torch.testing.assert_close(out.float(), ref.float(), rtol=rtol,
                               atol=rtol * ref.float().abs().max().item())


def tol(dtype: torch.dtype) -> float:
    return 2e-3 if dtype == torch.float32 else 1.6e-2


@pytest.mark.parametrize("m,e", [(1, 4), (2, 8), (3, 8)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_w13_kernel_matches_dequantized_math(m, e, dtype) -> None:
    """The w13 GEMV on exactly quantized inputs: only the fp32 sum order differs."""
    x, w13_q, w13_s, _, _, _, ids = experts(m, e, 256, 256, 2, dtype, seed=m)
    x_q, x_s = per_token_group_quant_fp8_ref(x, BLOCK[1])
    got = fused_moe_gemv_fp8_w13(x_q, x_s, w13_q, w13_s, ids, BLOCK, dtype)
    rows = dequantize_fp8(x_q, x_s, [1, BLOCK[1]]).repeat_interleave(2, dim=0)  # [P, H]
    w = dequantize_fp8(w13_q, w13_s, BLOCK)[ids.reshape(-1).long()]  # [P, 2I, H]
    gate_up = torch.einsum("ph,pnh->pn", rows, w).to(dtype)
    want = torch.nn.functional.silu(gate_up[:, :256]) * gate_up[:, 256:]
    assert got.dtype == dtype and got.shape == (m * 2, 256)
    assert_fp8_close(got, want, 1e-5 if dtype == torch.float32 else 2e-3)


@pytest.mark.parametrize("m,e", [(1, 4), (3, 8)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_w2_kernel_matches_dequantized_math(m, e, dtype) -> None:
    """The w2 GEMV with the weighted top-k sum on exactly quantized activation rows."""
    _, _, _, w2_q, w2_s, weights, ids = experts(m, e, 256, 256, 2, dtype, seed=10 + m)
    act = torch.randn(m * 2, 256, device=DEVICE).to(dtype)
    a_q, a_s = per_token_group_quant_fp8_ref(act, BLOCK[1])
    got = fused_moe_gemv_fp8_w2(a_q, a_s, w2_q, w2_s, weights, ids, BLOCK, dtype)
    per_pair = torch.einsum("pi,phi->ph", dequantize_fp8(a_q, a_s, [1, BLOCK[1]]),
                            dequantize_fp8(w2_q, w2_s, BLOCK)[ids.reshape(-1).long()])
    want = (per_pair.view(m, 2, -1) * weights[:, :, None]).sum(dim=1).to(dtype)
    assert got.dtype == dtype and got.shape == (m, 256)
    assert_fp8_close(got, want, 1e-5 if dtype == torch.float32 else 2e-3)


_SHAPES = {"default": (256, 256, None),
           "masked_k": (384, 384, GemvConfig(4, 256, 2, 1)),  # K ends inside a step
           "small_tiles": (256, 384, GemvConfig(2, 128, 1, 1))}  # row blocks, steps a program
_ON_CPU = {(1, "default"), (1, "masked_k"), (1, "small_tiles"), (3, "default")}


@pytest.mark.parametrize("m,h,i,config", [
    (m, *_SHAPES[name]) if (m, name) in _ON_CPU else cuda_only(
        m, *_SHAPES[name], why="CPU runs every shape at m = 1, m = 3 on the default one")
    for m in (1, 2, 3) for name in _SHAPES],
    ids=[f"{m}-{name}" for m in (1, 2, 3) for name in _SHAPES])
def test_fused_moe_gemv_fp8_matches_reference(m, h, i, config) -> None:
    """The four launches against fused_moe_gemv_fp8_ref (the same quantized math in torch)."""
    x, w13_q, w13_s, w2_q, w2_s, weights, ids = experts(m, 8, h, i, 2, torch.float32,
                                                        seed=m + h)
    configs = None if config is None else moe_gemv_fp8.MoeGemvConfigs(config, config)
    got = fused_moe_gemv_fp8(x, w13_q, w13_s, w2_q, w2_s, weights, ids, BLOCK, configs)
    want = fused_moe_gemv_fp8_ref(x, w13_q, w13_s, w2_q, w2_s, weights, ids, BLOCK)
    assert got.shape == (m, h) and got.dtype == torch.float32
    assert_fp8_close(got, want, 2e-3)


def triton_fp8(x, w13_q, w13_s, w2_q, w2_s, weights, ids, allow_gemv, block=BLOCK):
    return fused_experts_triton(x, w13_q, w2_q, weights, ids, SiluAndMul(),
                                allow_gemv=allow_gemv, use_fp8_w8a8=True, w1_scale=w13_s,
                                w2_scale=w2_s, block_shape=block)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,e", [(1, 8), cuda_only(2, 8, why="CPU runs m = 1 and m = 3"),
                                 (3, 4)])
def test_fused_moe_gemv_fp8_matches_the_gemm_path(m, e, dtype) -> None:
    """The GEMV pair against the FP8 fused_moe_kernel path on the same inputs (the same
    activation quantization; each pair rounded before the top-k sum there)."""
    args = experts(m, e, 256, 256, 2, dtype, seed=20 + m)
    got = fused_moe_gemv_fp8(*args, BLOCK)
    gemm = triton_fp8(args[0], *args[1:], allow_gemv=False)
    assert_fp8_close(got, gemm, tol(dtype))


@pytest.fixture
def gemv_calls(monkeypatch):
    """The calls of fused_moe_gemv_fp8 (the dispatch's lazy import sees the spy)."""
    calls = []

    def spy(*args, **kwargs):
        calls.append(args[-1])
        return real(*args, **kwargs)

    real = moe_gemv_fp8.fused_moe_gemv_fp8
    monkeypatch.setattr(moe_gemv_fp8, "fused_moe_gemv_fp8", spy)
    return calls


def test_dispatch_takes_the_fp8_gemv_in_the_sparse_regime(gemv_calls) -> None:
    """Block FP8 at M * top_k * 4 <= E takes the GEMV pair (the bf16 rule); a larger M, or
    allow_gemv=False, the GEMM."""
    args = experts(1, 8, 256, 256, 2, torch.float32, seed=3)
    got = triton_fp8(*args, allow_gemv=True)
    assert gemv_calls == [BLOCK]
    assert_fp8_close(got, fused_moe_gemv_fp8_ref(*args, BLOCK), 2e-3)
    triton_fp8(*args, allow_gemv=False)
    dense = experts(2, 8, 256, 256, 2, torch.float32, seed=4)  # 2 * 2 * 4 > 8
    triton_fp8(*dense, allow_gemv=True)
    assert gemv_calls == [BLOCK]


@pytest.mark.parametrize("mode", ["channel", "tensor"])
def test_dispatch_keeps_the_gemm_for_per_channel_and_per_tensor_fp8(mode, gemv_calls) -> None:
    x, *_, weights, ids = experts(1, 8, 256, 256, 2, torch.float32, seed=5)
    g = torch.Generator(DEVICE).manual_seed(5)
    w13_q, w13_s = quantize_weight(torch.randn(8, 512, 256, generator=g, device=DEVICE), mode)
    w2_q, w2_s = quantize_weight(torch.randn(8, 256, 256, generator=g, device=DEVICE), mode)
    triton_fp8(x, w13_q, w13_s, w2_q, w2_s, weights, ids, allow_gemv=True, block=None)
    assert gemv_calls == []


def test_fp8_moe_method_apply_takes_the_gemv(gemv_calls) -> None:
    """Fp8MoEMethod.apply (what FusedMoE runs for FP8 experts on CUDA) with a block
    checkpoint's layer at batch 1: the GEMV pair, the reference's output."""
    x, w13_q, w13_s, w2_q, w2_s, weights, ids = experts(1, 8, 256, 256, 2, torch.float32,
                                                        seed=6)
    layer = types.SimpleNamespace(w13_weight=w13_q, w2_weight=w2_q,
                                  w13_weight_scale_inv=w13_s, w2_weight_scale_inv=w2_s,
                                  act=SiluAndMul())
    got = Fp8MoEMethod(WeightScheme("block", tuple(BLOCK))).apply(layer, x, weights, ids)
    assert gemv_calls == [BLOCK]
    assert_fp8_close(got, fused_moe_gemv_fp8_ref(x, w13_q, w13_s, w2_q, w2_s, weights, ids,
                                                 BLOCK), 2e-3)


def test_config_rule() -> None:
    """w13's rows divide block_n (one scale row for each half); w2 one row a program."""
    cfg = fused_moe_gemv_fp8_config(2048, 512, 8, 128)
    assert cfg.w13 == GemvConfig(8, 512, 4, 1) and cfg.w2 == GemvConfig(1, 512, 1, 1)
    assert fused_moe_gemv_fp8_config(64, 32, 2, 4).w13.block_n == 4
    assert fused_moe_gemv_fp8_config(64, 96, 4, 96).w13.block_n == 8


def test_fused_moe_gemv_fp8_checks_its_arguments() -> None:
    x, w13_q, w13_s, w2_q, w2_s, weights, ids = experts(1, 4, 256, 256, 2, torch.float32)
    x_q, x_s = per_token_group_quant_fp8_ref(x, BLOCK[1])
    with pytest.raises(InvalidArgumentError, match="w13_scale must be"):
        fused_moe_gemv_fp8_w13(x_q, x_s, w13_q, w13_s[:, :2], ids, BLOCK, torch.float32)
    with pytest.raises(InvalidArgumentError, match="x_q must be a contiguous float8"):
        fused_moe_gemv_fp8_w13(x, x_s, w13_q, w13_s, ids, BLOCK, torch.float32)
    with pytest.raises(InvalidArgumentError, match="w13 must be a contiguous"):
        fused_moe_gemv_fp8_w13(x_q, x_s, w13_q.float(), w13_s, ids, BLOCK, torch.float32)
    with pytest.raises(InvalidArgumentError, match="BN 8 must divide block_n 4"):
        fused_moe_gemv_fp8_w13(x_q, x_s, w13_q, torch.ones(4, 128, 2), ids, [4, 128],
                               torch.float32, GemvConfig(8, 128, 1, 1))
    with pytest.raises(InvalidArgumentError, match="block_k dividing"):
        fused_moe_gemv_fp8(x, w13_q, w13_s, w2_q, w2_s, weights, ids, [128, 96])
    a_q, a_s = per_token_group_quant_fp8_ref(torch.randn(2, 256), BLOCK[1])
    with pytest.raises(InvalidArgumentError, match="topk_weights must be"):
        fused_moe_gemv_fp8_w2(a_q, a_s, w2_q, w2_s, weights.double(), ids, BLOCK,
                              torch.float32)
    with pytest.raises(InvalidArgumentError, match="act_q_scale must be"):
        fused_moe_gemv_fp8_w2(a_q, a_s[:1], w2_q, w2_s, weights, ids, BLOCK, torch.float32)


QWEN35 = {"e": 256, "h": 2048, "i": 512, "topk": 8}  # Qwen3.5-35B-A3B's routed experts


@gpu
@pytest.mark.parametrize("m", [1, 4, 16])
def test_fused_moe_gemv_fp8_qwen35_moe(m) -> None:
    """Qwen3.5-35B-A3B's experts in bf16 with [128, 128] FP8 blocks: the GEMV pair (with the
    Triton quantization) against its reference and the FP8 GEMM path (M 16 is past the
    dispatch's regime: the kernels called directly)."""
    q = QWEN35
    args = experts(m, q["e"], q["h"], q["i"], q["topk"], torch.bfloat16, seed=m)
    got = fused_moe_gemv_fp8(*args, BLOCK)
    assert_fp8_close(got, fused_moe_gemv_fp8_ref(*args, BLOCK), 1.6e-2)
    assert_fp8_close(got, triton_fp8(*args, allow_gemv=False), 1.6e-2)


@gpu
def test_fused_moe_gemv_fp8_under_a_cuda_graph_without_host_sync() -> None:
    """The dispatch at batch 1 never waits on the host and replays from a CUDA graph on new
    inputs with the eager result."""
    q = QWEN35
    x, *rest = experts(1, q["e"], q["h"], q["i"], q["topk"], torch.bfloat16)

    def step():
        return triton_fp8(x, *rest, allow_gemv=True)

    run_without_host_sync(step)
    graph, out = capture(step)
    for seed in range(4):
        x.copy_(torch.randn(1, q["h"], generator=torch.Generator(DEVICE).manual_seed(seed),
                            device=DEVICE).bfloat16())
        graph.replay()
        torch.testing.assert_close(out, step(), atol=0, rtol=0)
