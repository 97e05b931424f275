"""kernels/fused_moe.py's FP8 W8A8 path (use_fp8_w8a8: block, per-channel and per-tensor
scales) against the dequantized reference, and engine fused_experts_triton with FP8
experts against the torch path on the dequantized weights (block FP8 in the sparse regime:
the GEMV pair, tests/test_kernels_fused_moe_gemv_fp8.py).

Mirrors vLLM 0.33 tests/kernels/moe/test_block_fp8.py (test_w8a8_block_fp8_fused_moe:
fused_experts with use_fp8_w8a8 and block_shape against torch_w8a8_block_fp8_moe, the
dequantized oracle) and tests/kernels/moe/test_moe.py's FP8 per-tensor / per-channel
cases. The kernel comparisons take activations quantized by the torch references (exact
inputs, so only the GEMM's rounding is compared); the launcher's own quantization is
checked against quantizing first (same kernels, equal outputs). Under the interpreter on
CPU with [32, 32] blocks (the end-to-end test quantizing in torch there, its fixture says
why); Qwen3.5-35B-A3B's experts (E=256, H=2048, I=512, top-8,
[128, 128] blocks) on CUDA with FP8 (sm_89+).
"""

from __future__ import annotations

import pytest
import torch
from test_kernels_common import DEVICE, DTYPES, ON_CUDA, gpu, run_without_host_sync

from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.layers.activation import SiluAndMul
from libvllm.engine.layers.fused_moe import fused_experts, fused_experts_triton, fused_topk
from libvllm.kernels import fused_moe, fused_moe_gemv_fp8
from libvllm.kernels._common import cdiv
from libvllm.kernels.activation import silu_and_mul_ref
from libvllm.kernels.fp8_quant import (
    FP8_DTYPE,
    FP8_MAX,
    dequantize_fp8,
    per_token_group_quant_fp8_ref,
    scaled_fp8_quant_ref,
)
from libvllm.kernels.fused_moe import (
    invoke_fused_moe_kernel,
    invoke_fused_moe_kernel_ref,
    quantize_moe_input,
)
from libvllm.kernels.moe_align_block_size import moe_align_block_size

if ON_CUDA and torch.cuda.get_device_capability() < (8, 9):
    pytest.skip("the FP8 kernels need an sm_89+ GPU", allow_module_level=True)
CONFIG = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 1,
          "num_warps": 4, "num_stages": 2}
BLOCK = [32, 32]
MODES = ["block", "channel", "tensor"]


def quantize_weight(w: torch.Tensor, mode: str, block: list[int] = BLOCK):
    """w [E, N, K] float -> (fp8 [E, N, K], scales: [E, N / bn, K / bk] / [E, N, 1] / [E])."""
    e, n, k = w.shape
    if mode == "block":
        bn, bk = block
        wp = torch.nn.functional.pad(w.float(), (0, cdiv(k, bk) * bk - k, 0,
                                                 cdiv(n, bn) * bn - n))
        s = wp.reshape(e, cdiv(n, bn), bn, cdiv(k, bk), bk).abs().amax(dim=(2, 4)) / FP8_MAX
        scale = s.clamp(min=1e-12)
    elif mode == "channel":
        scale = w.float().abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / FP8_MAX
    else:
        scale = w.float().abs().amax(dim=(1, 2)).clamp(min=1e-12) / FP8_MAX
    w_q = (w.float() / dequantize_fp8(torch.ones_like(w, dtype=FP8_DTYPE), scale,
                                      block if mode == "block" else None))
    return w_q.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


def quantize_act(a: torch.Tensor, mode: str, block: list[int] = BLOCK):
    """The activations as the launcher quantizes them, in torch: (fp8, scales)."""
    if mode == "block":
        return per_token_group_quant_fp8_ref(a, block[1])
    return scaled_fp8_quant_ref(a, use_per_token_if_dynamic=mode == "channel")


def assignment(ids: torch.Tensor, e: int, aligned: bool):
    if aligned:
        return moe_align_block_size(ids, CONFIG["BLOCK_SIZE_M"], e)
    return None, ids.reshape(-1), None


def inputs(m, e, n, k, topk, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g)
    b = torch.randn(e, n, k, generator=g) / k ** 0.5
    w = torch.rand(m, topk, generator=g)
    ids = torch.rand(m, e, generator=g).topk(topk, dim=-1).indices.to(torch.int32)
    return a, b, w.to(DEVICE), ids.to(DEVICE)


def assert_moe_close(out: torch.Tensor, ref: torch.Tensor) -> None:
    """FP8 products summed in fp32 (Hopper's FP8 MMA: ~14-bit within one K step), then
    the output's rounding; relative to the output's scale."""
    rtol = 2e-3 if ref.dtype == torch.float32 else 1.6e-2
    torch.testing.assert_close(out.float(), ref.float(), rtol=rtol,
                               atol=rtol * ref.float().abs().max().item())


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("silu", [False, True], ids=["plain", "silu"])
@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "naive"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_moe_kernel_fp8_matches_reference(mode, silu, aligned, dtype) -> None:
    m, e, n, topk = 5, 8, 48, 2  # N not a multiple of the block or the tiles
    k = 96 if mode == "block" else 80  # K: whole activation groups; else ending in a step
    a, b, w, ids = inputs(m, e, 2 * n if silu else n, k, topk, seed=len(mode))
    a_q, a_s = quantize_act(a, mode)
    b_q, b_s = quantize_weight(b, mode)
    a_q, a_s, b_q, b_s = (t.to(DEVICE) for t in (a_q, a_s, b_q, b_s))
    block = BLOCK if mode == "block" else None
    ref = invoke_fused_moe_kernel_ref(dequantize_fp8(a_q, a_s, [1, BLOCK[1]] if block else None),
                                      dequantize_fp8(b_q, b_s, block), w, ids, False, topk)
    for mul in [False] if silu else [False, True]:
        c = torch.full((m, topk, n), float("nan"), dtype=dtype, device=DEVICE)
        invoke_fused_moe_kernel(a_q, b_q, c, w, *assignment(ids, e, aligned), mul, topk,
                                CONFIG, silu_and_mul=silu, use_fp8_w8a8=True, A_scale=a_s,
                                B_scale=b_s, block_shape=block)
        want = ref * w.reshape(-1, 1) if mul else ref
        want = silu_and_mul_ref(want.to(dtype)) if silu else want.to(dtype)
        assert_moe_close(c.view(m * topk, n), want)


@pytest.mark.parametrize("mode,static", [("block", False), ("channel", False),
                                         ("tensor", False), ("tensor", True),
                                         ("channel", True)])
def test_fused_moe_kernel_fp8_quantizes_float_activations(mode, static) -> None:
    """A float A is quantized in the launcher (upstream's moe_kernel_quantize_input, a
    static A_scale or dynamic): the same output as quantizing first."""
    m, e, n, k, topk = 6, 4, 32, 64, 2
    a, b, w, ids = inputs(m, e, n, k, topk, seed=3)
    a = a.to(DEVICE)
    b_q, b_s = (t.to(DEVICE) for t in quantize_weight(b, mode))
    block = BLOCK if mode == "block" else None
    a_scale = torch.tensor([0.02], device=DEVICE) if static else None
    a_q, a_s = quantize_moe_input(a, a_scale, mode == "channel", block)
    outs = []
    for a_in, s_in in ((a, a_scale), (a_q, a_s)):
        c = torch.empty(m, topk, n, device=DEVICE)
        invoke_fused_moe_kernel(a_in, b_q, c, w, None, ids.reshape(-1), None, True, topk,
                                CONFIG, use_fp8_w8a8=True, A_scale=s_in, B_scale=b_s,
                                block_shape=block)
        outs.append(c)
    torch.testing.assert_close(outs[0], outs[1], atol=0, rtol=0)


def test_fused_moe_kernel_fp8_checks_its_arguments() -> None:
    m, e, n, k, topk = 2, 4, 32, 64, 2
    a, b, w, ids = inputs(m, e, n, k, topk)
    a = a.to(DEVICE)
    b_q, b_s = (t.to(DEVICE) for t in quantize_weight(b, "block"))
    c = torch.empty(m, topk, n, device=DEVICE)
    launch = (c, w, None, ids.reshape(-1), None, True, topk, CONFIG)
    with pytest.raises(InvalidArgumentError, match="B_scale must be"):
        invoke_fused_moe_kernel(a, b_q, *launch, use_fp8_w8a8=True, B_scale=b_s[..., :1],
                                block_shape=BLOCK)
    with pytest.raises(InvalidArgumentError, match="needs B_scale"):
        invoke_fused_moe_kernel(a, b_q, *launch, use_fp8_w8a8=True, block_shape=BLOCK)
    with pytest.raises(InvalidArgumentError, match="fp8 A needs its A_scale"):
        invoke_fused_moe_kernel(a.to(FP8_DTYPE), b_q, *launch, use_fp8_w8a8=True,
                                B_scale=b_s, block_shape=BLOCK)
    with pytest.raises(InvalidArgumentError, match="FP8 path's"):
        invoke_fused_moe_kernel(a, b.to(DEVICE), *launch, B_scale=b_s)
    with pytest.raises(InvalidArgumentError, match="B_scale must be .* \\(per channel\\)"):
        invoke_fused_moe_kernel(a, b_q, *launch, use_fp8_w8a8=True,
                                B_scale=torch.ones(e, 3, 1, device=DEVICE))


def experts_fp8(m, e, h, i, topk, mode, block, dtype, seed=0):
    """Made on the device (Qwen3.5's 256 experts are ~1.6e9 values in fp32)."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    x = torch.randn(m, h, generator=g, device=DEVICE).to(dtype)
    w13 = torch.randn(e, 2 * i, h, generator=g, device=DEVICE) / h ** 0.5
    w2 = torch.randn(e, h, i, generator=g, device=DEVICE) / i ** 0.5
    (w13_q, w13_s), (w2_q, w2_s) = quantize_weight(w13, mode, block), quantize_weight(
        w2, mode, block)
    logits = torch.randn(m, e, generator=g, device=DEVICE)
    weights, ids = fused_topk(logits, topk, renormalize=True)
    return x, [w13_q, w13_s, w2_q, w2_s], weights, ids


def check_experts(m, e, h, i, topk, mode, block, dtype, config=None) -> None:
    """fp8 fused_experts_triton against the torch path on the dequantized weights: only the
    activations' quantization (two of them) differs, a few % of the output's norm."""
    x, (w13_q, w13_s, w2_q, w2_s), weights, ids = experts_fp8(m, e, h, i, topk, mode, block,
                                                              dtype, seed=m)
    bs = block if mode == "block" else None
    got = fused_experts_triton(x, w13_q, w2_q, weights, ids, SiluAndMul(), config=config,
                               use_fp8_w8a8=True, w1_scale=w13_s, w2_scale=w2_s,
                               block_shape=bs)
    want = fused_experts(x.float(), dequantize_fp8(w13_q, w13_s, bs),
                         dequantize_fp8(w2_q, w2_s, bs), weights, ids.long(), SiluAndMul())
    assert got.dtype == dtype and got.shape == (m, h)
    rel = ((got.float() - want).norm() / want.norm()).item()
    assert rel < 0.08, rel


@pytest.fixture
def torch_quant_under_interpreter(monkeypatch):
    """Under the interpreter the launchers (the GEMM's, and the block-FP8 GEMV pair's that
    the sparse block case takes) quantize with the torch references: the interpreter's
    fp32 -> fp8 store halves values that round up to a power of two
    (tests/test_kernels_fp8.py assert_fp8_equal), ~15% of the output's norm here."""
    if not ON_CUDA:
        monkeypatch.setattr(fused_moe_gemv_fp8, "per_token_group_quant_fp8",
                            per_token_group_quant_fp8_ref)
        monkeypatch.setattr(fused_moe, "per_token_group_quant_fp8",
                            per_token_group_quant_fp8_ref)
        monkeypatch.setattr(fused_moe, "scaled_fp8_quant", lambda a, s, **kw: (
            scaled_fp8_quant_ref(a, s, **kw)))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("m,e,topk", [(1, 64, 4), (20, 8, 2)], ids=["naive", "aligned"])
def test_fused_experts_triton_fp8(mode, m, e, topk, torch_quant_under_interpreter) -> None:
    check_experts(m, e, 64, 32, topk, mode, BLOCK, torch.float32, config=CONFIG)


@gpu
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("m", [1, 8, 64, 512])
def test_fused_experts_triton_fp8_qwen35_moe(mode, m) -> None:
    """Qwen3.5-35B-A3B's routed experts in bf16 with FP8 weights, the configs the layer
    picks (default or tuned)."""
    check_experts(m, 256, 2048, 512, 8, mode, [128, 128], torch.bfloat16)


@gpu
def test_fused_experts_triton_fp8_no_host_sync() -> None:
    """The FP8 path (dynamic activation scales included) never waits on the host."""
    x, (w13_q, w13_s, w2_q, w2_s), weights, ids = experts_fp8(
        4, 256, 2048, 512, 8, "block", [128, 128], torch.bfloat16)

    def run():
        return fused_experts_triton(x, w13_q, w2_q, weights, ids, SiluAndMul(),
                                    use_fp8_w8a8=True, w1_scale=w13_s, w2_scale=w2_s,
                                    block_shape=[128, 128])

    run_without_host_sync(run)
