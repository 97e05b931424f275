"""kernels/fp8_quant.py, kernels/fp8_block_gemm.py (with kernels/fp8_gemv.py, its one-row
path) and kernels/fp8_scaled_mm.py against their torch references (the dequantized fp32
matmul for the GEMMs), and the block GEMM's config loader.

Mirrors vLLM 0.33 tests/kernels/quantization/test_block_fp8.py (test_per_token_group_quant_fp8,
test_w8a8_block_fp8_matmul: native_w8a8_block_matmul as the oracle, block sizes [128, 128]
and shapes not a multiple of the block) and tests/kernels/quantization/test_fp8_quant.py
(static / dynamic per-tensor / dynamic per-token scaled_fp8_quant against the torch
arithmetic, scale_ub). On CPU the kernels run under the Triton interpreter on small shapes;
its fp32 -> fp8 store is not round-to-nearest-even (assert_fp8_equal), so there the
quantized values are compared to one FP8 step, exactly on CUDA. Llama-3.1-8B and
Qwen3.5-35B-A3B shapes on CUDA with FP8 (sm_89+).
"""

from __future__ import annotations

import json

import pytest
import torch
from test_kernels_common import DEVICE, ON_CUDA, cuda_only, gpu

from libvllm.engine.errors import InvalidArgumentError
from libvllm.kernels import fp8_block_gemm
from libvllm.kernels._common import cdiv
from libvllm.kernels.fp8_block_gemm import (
    get_config,
    get_config_file_name,
    w8a8_block_fp8_matmul,
    w8a8_block_fp8_matmul_ref,
)
from libvllm.kernels.fp8_gemv import w8a8_block_fp8_gemv
from libvllm.kernels.fp8_quant import (
    FP8_DTYPE,
    FP8_MAX,
    per_token_group_quant_fp8,
    per_token_group_quant_fp8_ref,
    scaled_fp8_quant,
    scaled_fp8_quant_ref,
)
from libvllm.kernels.fp8_scaled_mm import (
    BLOCK_ROWS,
    block_scaled_mm_supported,
    fp8_block_scaled_mm,
    fp8_scaled_mm,
    fp8_scaled_mm_ref,
)
from libvllm.kernels.launch_configs import GemmConfig, GemvConfig

FP8_ON_CUDA = ON_CUDA and torch.cuda.get_device_capability() >= (8, 9)
if ON_CUDA and not FP8_ON_CUDA:
    pytest.skip("the FP8 kernels need an sm_89+ GPU", allow_module_level=True)
QUANT_DTYPES = [torch.bfloat16, torch.float16, torch.float32] if ON_CUDA else [torch.float32]
# (N, K) of Llama-3.1-8B (qkv, o, gate_up, down) and Qwen3.5-35B-A3B's dense layers
MODEL_SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336),
                (9216, 2048), (2048, 4096), (12288, 2048), (1024, 2048), (2048, 512)]


def assert_fp8_equal(q: torch.Tensor, ref: torch.Tensor) -> None:
    """Bit equality on CUDA. The interpreter's fp32 -> fp8 store truncates subnormals and
    rounds ties up (one FP8 step off) and takes a value that rounds up to a power of two
    to the power below: there, one step away from powers of two."""
    assert q.dtype == FP8_DTYPE and q.shape == ref.shape
    q, ref = q.float(), ref.float()
    if ON_CUDA:
        torch.testing.assert_close(q, ref, atol=0, rtol=0)
        return
    mantissa, exponent = torch.frexp(ref)
    step = torch.exp2(((exponent - 1).clamp(min=-6) - 3).float())  # e4m3's spacing at ref
    keep = mantissa.abs() != 0.5
    assert ((q - ref).abs() <= step)[keep].all()


def assert_gemm_close(out: torch.Tensor, ref: torch.Tensor) -> None:
    """Against the fp32 dequantized matmul: output rounding plus Hopper's FP8 MMA
    accumulation (a ~14-bit mantissa within one K tile), relative to the output's scale."""
    assert out.dtype == ref.dtype and out.shape == ref.shape
    rtol = 2e-3 if ref.dtype == torch.float32 else 1.6e-2
    torch.testing.assert_close(out.float(), ref.float(), rtol=rtol,
                               atol=rtol * ref.float().abs().max().item())


@pytest.mark.parametrize("m,k,group", [(1, 128, 128), (7, 512, 128), (5, 192, 64),
                                       cuda_only(33, 7168, 128, why="big rows"),
                                       cuda_only(4096, 4096, 128, why="many rows")])
@pytest.mark.parametrize("dtype", QUANT_DTYPES)
@pytest.mark.parametrize("column_major", [False, True])
def test_per_token_group_quant_fp8(m, k, group, dtype, column_major) -> None:
    x = (torch.randn(m, k) * 4).to(dtype).to(DEVICE)
    x[0, :group] = 0  # an all-zero group: scale eps / 448, zeros out
    q, s = per_token_group_quant_fp8(x, group, column_major_scales=column_major)
    q_ref, s_ref = per_token_group_quant_fp8_ref(x, group)
    assert s.shape == (m, k // group) and s.dtype == torch.float32
    assert (s.t() if column_major else s).is_contiguous()
    torch.testing.assert_close(s, s_ref, atol=0, rtol=0)
    assert_fp8_equal(q, q_ref)


@pytest.mark.parametrize("m", [1, 5, 8])
def test_per_token_group_quant_fp8_row_multiple(m) -> None:
    """Rows padded to a multiple of 4 for cuBLASLt: the scales' column stride is the padded
    row count and the first M rows are the unpadded result."""
    x = (torch.randn(m, 256) * 4).to(DEVICE)
    q, s = per_token_group_quant_fp8(x, 128, column_major_scales=True, row_multiple=4)
    rows = -(-m // 4) * 4
    assert q.shape == (rows, 256) and s.shape == (rows, 2) and s.stride() == (1, rows)
    q_ref, s_ref = per_token_group_quant_fp8_ref(x, 128)
    torch.testing.assert_close(s[:m], s_ref, atol=0, rtol=0)
    assert_fp8_equal(q[:m], q_ref)


def test_per_token_group_quant_fp8_ref_arithmetic() -> None:
    """Each group's largest magnitude maps to +-448, the rest within FP8's rounding."""
    x = torch.randn(3, 256) * torch.tensor([1e-3, 1.0, 1e3]).reshape(3, 1)
    q, s = per_token_group_quant_fp8_ref(x, 128)
    amax = x.reshape(3, 2, 128).abs().amax(-1)
    torch.testing.assert_close(s, amax / FP8_MAX)
    assert torch.equal(q.float().reshape(3, 2, 128).abs().amax(-1), torch.full((3, 2), 448.))
    deq = q.float().reshape(3, 2, 128) * s[..., None]
    torch.testing.assert_close(deq.reshape(3, 256), x, rtol=2 ** -4, atol=0)


def test_per_token_group_quant_fp8_errors() -> None:
    x = torch.randn(2, 192, device=DEVICE)
    with pytest.raises(InvalidArgumentError, match="must be divisible by `group_size` 128"):
        per_token_group_quant_fp8(x, 128)
    with pytest.raises(InvalidArgumentError, match="must be float32, float16 or bfloat16"):
        per_token_group_quant_fp8(x.to(torch.int32), 64)
    with pytest.raises(InvalidArgumentError, match="groups must be contiguous"):
        per_token_group_quant_fp8(torch.randn(192, 2, device=DEVICE).t(), 64)


@pytest.mark.parametrize("mode", ["static_tensor", "static_token", "dynamic_tensor",
                                  "dynamic_token", "dynamic_token_ub"])
@pytest.mark.parametrize("m,n", [(1, 64), (9, 1000), cuda_only(300, 8192, why="big")])
@pytest.mark.parametrize("dtype", QUANT_DTYPES)
def test_scaled_fp8_quant(mode, m, n, dtype) -> None:
    x = (torch.randn(m, n) * 10).to(dtype).to(DEVICE)
    scale = {"static_tensor": torch.tensor(0.03, device=DEVICE),
             "static_token": torch.rand(m, 1, device=DEVICE) * 0.05 + 0.001}.get(mode)
    per_token = mode.startswith("dynamic_token")
    ub = torch.tensor([5.0], device=DEVICE) if mode.endswith("_ub") else None
    q, s = scaled_fp8_quant(x, scale, scale_ub=ub, use_per_token_if_dynamic=per_token)
    q_ref, s_ref = scaled_fp8_quant_ref(x, scale, scale_ub=ub,
                                        use_per_token_if_dynamic=per_token)
    assert s.shape == ((m, 1) if per_token else (1,)) or scale is not None
    torch.testing.assert_close(s, s_ref, atol=0, rtol=0)
    assert_fp8_equal(q, q_ref)
    if mode == "dynamic_tensor":  # the tensor's largest magnitude maps to 448
        assert q.float().abs().max().item() == FP8_MAX


def test_scaled_fp8_quant_padding_and_floor() -> None:
    x = torch.zeros(3, 32, device=DEVICE)
    q, s = scaled_fp8_quant(x, num_token_padding=8, use_per_token_if_dynamic=True)
    assert q.shape == (8, 32)
    assert torch.equal(s, torch.full((3, 1), 1 / (448 * 512), device=DEVICE))
    assert torch.equal(q[:3].float(), x)


def test_scaled_fp8_quant_errors() -> None:
    x = torch.randn(4, 32, device=DEVICE)
    with pytest.raises(InvalidArgumentError, match="one value or \\[M, 1\\]"):
        scaled_fp8_quant(x, torch.ones(32, device=DEVICE))
    with pytest.raises(InvalidArgumentError, match="scale_ub"):
        scaled_fp8_quant(x, scale_ub=torch.ones(1, device=DEVICE))
    with pytest.raises(InvalidArgumentError, match="2D"):
        scaled_fp8_quant(x.reshape(2, 2, 32))


def block_inputs(m, n, k, block, seed=0):
    """A quantized per token group of block[1] (padded to a whole group, as a checkpoint's
    activations would be on a K that is not a multiple), B fp8 with random block scales."""
    g = torch.Generator().manual_seed(seed)
    bn, bk = block
    x = torch.randn(m, cdiv(k, bk) * bk, generator=g)
    x[:, k:] = 0
    a, a_s = per_token_group_quant_fp8_ref(x, bk)
    w = (torch.randn(n, k, generator=g) * 100).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    b_s = torch.rand(cdiv(n, bn), cdiv(k, bk), generator=g) * 1e-2 + 1e-3
    return (a[:, :k].contiguous().to(DEVICE), w.to(DEVICE), a_s.to(DEVICE), b_s.to(DEVICE))


@pytest.mark.parametrize("m,n,k,block", [
    (1, 64, 64, [32, 32]), (17, 130, 200, [32, 32]), (5, 96, 160, [64, 32]),
    cuda_only(1, 4096, 4096, [128, 128], why="Llama o_proj, one row"),
    cuda_only(33, 300, 1000, [128, 128], why="edges at block 128"),
    cuda_only(257, 2048, 512, [128, 128], why="many rows")])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_w8a8_block_fp8_matmul(m, n, k, block, out_dtype) -> None:
    a, b, a_s, b_s = block_inputs(m, n, k, block)
    config = None if ON_CUDA else GemmConfig(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32,
                                             BLOCK_SIZE_K=32, GROUP_SIZE_M=2,
                                             num_warps=4, num_stages=2)
    out = w8a8_block_fp8_matmul(a, b, a_s, b_s, block, out_dtype, config=config)
    assert_gemm_close(out, w8a8_block_fp8_matmul_ref(a, b, a_s, b_s, block, out_dtype))


@gpu
@pytest.mark.parametrize("n,k", MODEL_SHAPES)
@pytest.mark.parametrize("m", [1, 16, 300])
def test_w8a8_block_fp8_matmul_model_shapes(m, n, k) -> None:
    """Quantize-then-GEMM at the models' shapes, tuned config or default; the result also
    stays within FP8's error of the unquantized bf16 matmul."""
    x = torch.randn(m, k, device=DEVICE, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=DEVICE, dtype=torch.bfloat16) / k ** 0.5
    a, a_s = per_token_group_quant_fp8(x, 128)
    _, w_s = per_token_group_quant_fp8(w, 128)  # [N, K / 128], per [1, 128] block
    b_s = w_s.reshape(cdiv(n, 128), 128, -1).amax(1)  # one scale per [128, 128] block
    b = (w.float().reshape(n // 128, 128, -1, 128) / b_s[:, None, :, None]).reshape(n, k)
    b = b.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    out = w8a8_block_fp8_matmul(a, b, a_s, b_s, [128, 128], torch.bfloat16)
    assert_gemm_close(out, w8a8_block_fp8_matmul_ref(a, b, a_s, b_s, [128, 128]))
    exact = x.float() @ w.float().t()
    rel = (out.float() - exact).norm() / exact.norm()
    assert rel < 0.05, rel


@gpu
@pytest.mark.parametrize("n,k", MODEL_SHAPES)
@pytest.mark.parametrize("m", [2, 16, 301])
def test_fp8_block_scaled_mm_model_shapes(m, n, k) -> None:
    """cuBLASLt's block-scaled GEMM (what a block-FP8 linear runs from two rows) against
    the dequantized fp32 matmul, on the padded-row, column-major-scale layout."""
    x = torch.randn(m, k, device=DEVICE, dtype=torch.bfloat16)
    _, b, _, b_s = block_inputs(1, n, k, [128, 128])  # b [N, K] fp8, b_s [N/128, K/128]
    if not block_scaled_mm_supported(x, b, [128, 128]):
        pytest.skip("cuBLASLt block scaling needs CUDA 12.9+ on sm_90")
    a, a_s = per_token_group_quant_fp8(x, 128)
    a_p, a_s_p = per_token_group_quant_fp8(x, 128, column_major_scales=True,
                                           row_multiple=BLOCK_ROWS)
    out = fp8_block_scaled_mm(a_p, b, a_s_p, b_s, torch.bfloat16)[:m]
    assert_gemm_close(out, w8a8_block_fp8_matmul_ref(a, b, a_s, b_s, [128, 128]))


@pytest.mark.parametrize("n,k,block", [(70, 200, [32, 32]), (64, 256, [64, 128]),
                                       (5, 96, [32, 32])])
@pytest.mark.parametrize("config", [None, (2, 32, 4, 2), (8, 64, 4, 1)],
                         ids=["default", "bn2-bk32", "bn8-bk64"])
def test_w8a8_block_fp8_gemv(n, k, block, config) -> None:
    """The one-row GEMV (masked and whole K steps, BK above and below block_k), and the
    block GEMM's dispatch to it at M = 1."""
    a, b, a_s, b_s = block_inputs(1, n, k, block, seed=n)
    ref = w8a8_block_fp8_matmul_ref(a, b, a_s, b_s, block, torch.float32)
    out = w8a8_block_fp8_gemv(a, b, a_s, b_s, block, torch.float32,
                              config=config and GemvConfig(*config))
    assert_gemm_close(out, ref)
    if config is None:
        dispatched = w8a8_block_fp8_matmul(a, b, a_s, b_s, block, torch.float32)
        torch.testing.assert_close(dispatched, out, atol=0, rtol=0)


def test_w8a8_block_fp8_matmul_errors() -> None:
    a, b, a_s, b_s = block_inputs(4, 64, 64, [32, 32])
    with pytest.raises(InvalidArgumentError, match="As must be"):
        w8a8_block_fp8_matmul(a, b, a_s[:, :1], b_s, [32, 32])
    with pytest.raises(InvalidArgumentError, match="Bs must be"):
        w8a8_block_fp8_matmul(a, b, a_s, b_s[:1], [32, 32])
    with pytest.raises(InvalidArgumentError, match="float8_e4m3fn"):
        w8a8_block_fp8_matmul(a.float(), b, a_s, b_s, [32, 32])
    with pytest.raises(InvalidArgumentError, match="must divide block_k"):
        w8a8_block_fp8_matmul(a, b, a_s, b_s, [32, 32], config=GemmConfig(
            BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=64, GROUP_SIZE_M=1,
            num_warps=4, num_stages=2))
    assert w8a8_block_fp8_matmul(a[:0], b, a_s[:0], b_s, [32, 32]).shape == (0, 64)


def test_block_fp8_config_loader(tmp_path, monkeypatch) -> None:
    """Upstream's file name; the nearest tuned M's config; the default without a file."""
    name = get_config_file_name(4096, 14336, 128, 128, "NVIDIA_H200")
    assert name == ("N=4096,K=14336,device_name=NVIDIA_H200,dtype=fp8_w8a8,"
                    "block_shape=[128,128].json")
    small = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
             "num_warps": 4, "num_stages": 3}
    big = dict(small, BLOCK_SIZE_M=128, num_warps=8)
    path = tmp_path / get_config_file_name(4096, 14336, 128, 128)
    path.write_text(json.dumps({"1": small, "1024": big}))
    monkeypatch.setattr(fp8_block_gemm, "CONFIG_DIR", str(tmp_path))
    fp8_block_gemm.get_w8a8_block_fp8_configs.cache_clear()
    try:
        assert get_config(3, 4096, 14336, 128, 128) == GemmConfig(**small)
        assert get_config(900, 4096, 14336, 128, 128) == GemmConfig(**big)
        assert get_config(3, 4096, 4096, 128, 128) == fp8_block_gemm.default_config(128, 128)
    finally:
        fp8_block_gemm.get_w8a8_block_fp8_configs.cache_clear()


def scaled_mm_inputs(m, n, k, a_rows, b_rows, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(m, k, generator=g) * 50).to(FP8_DTYPE).to(DEVICE)
    b = (torch.randn(n, k, generator=g) * 50).to(FP8_DTYPE).to(DEVICE)
    a_s = torch.rand(m if a_rows else 1, 1, generator=g) * 1e-2 + 1e-3
    b_s = torch.rand(n if b_rows else 1, 1, generator=g) * 1e-2 + 1e-3
    return a, b, (a_s if a_rows else a_s.reshape(())).to(DEVICE), b_s.to(DEVICE)


@pytest.mark.parametrize("m,n,k", [(1, 64, 128), (19, 48, 96), (7, 40, 72)])
@pytest.mark.parametrize("a_rows,b_rows", [(False, False), (True, True), (False, True),
                                           (True, False)])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("with_bias", [False, True])
def test_fp8_scaled_mm(m, n, k, a_rows, b_rows, out_dtype, with_bias) -> None:
    """torch._scaled_mm (per tensor, row-wise, channel-wise) on CUDA, the dequantized
    matmul on CPU and for K, N not multiples of 16 (the (7, 40, 72) case)."""
    a, b, a_s, b_s = scaled_mm_inputs(m, n, k, a_rows, b_rows)
    bias = torch.randn(n, device=DEVICE).to(out_dtype) if with_bias else None
    out = fp8_scaled_mm(a, b, a_s, b_s, out_dtype, bias)
    assert_gemm_close(out, fp8_scaled_mm_ref(a, b, a_s, b_s, out_dtype, bias))


def test_fp8_scaled_mm_errors() -> None:
    a, b, a_s, b_s = scaled_mm_inputs(4, 32, 32, True, True)
    with pytest.raises(InvalidArgumentError, match="do not match"):
        fp8_scaled_mm(a, b[:, :16].contiguous(), a_s, b_s, torch.bfloat16)
    with pytest.raises(InvalidArgumentError, match="b_scale must be fp32 of one value or"):
        fp8_scaled_mm(a, b, a_s, b_s[:3], torch.bfloat16)
    with pytest.raises(InvalidArgumentError, match="bias must be"):
        fp8_scaled_mm(a, b, a_s, b_s, torch.bfloat16, torch.zeros(3, device=DEVICE))
