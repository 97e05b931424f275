"""The W8A8 FP8 GEMM with per-tensor or per-row scales on torch._scaled_mm (cuBLASLt /
CUTLASS on sm_89+): C = (a_q * a_scale) @ (b_q * b_scale)^T + bias.

Mirrors vllm/model_executor/kernels/linear/scaled_mm/pytorch.py (the per-tensor kernel,
the row-wise one with scale_a [M, 1] and scale_b [1, N], and the channel-wise fallback:
_scaled_mm into fp32 with unit scales, then the scales and bias applied in fp32) and the
scale layouts of vllm/model_executor/layers/quantization/utils/w8a8_utils.py. The weight
goes in as b_q.t(), a column-major view of the [N, K] checkpoint tensor. A per-tensor
scale beside a per-row one is expanded to rows (torch takes both tensor-wise or both
row-wise); row-wise _scaled_mm gives bf16 only, so other output dtypes take the
channel-wise path. Without _scaled_mm (CPU, pre-Ada GPUs, K or N not a multiple of 16,
cuBLASLt's rule) the dequantized fp32 matmul computes the same product.

fp8_block_scaled_mm is the DeepSeek-style block-FP8 GEMM on cuBLASLt (CUDA >= 12.9,
sm_90): activations scaled per [1, 128] token group, weights per [128, 128] block, the
layout torch._scaled_mm takes as BlockWise1x128 x BlockWise128x128 (the role vLLM's
CUTLASS `cutlass_scaled_mm` block path plays in
vllm/model_executor/layers/quantization/utils/fp8_utils.py). It wants the activation
scales column-major with a row count that is a multiple of 4 and the weight's K blocks a
multiple of 4 (block_scaled_mm_supported); other shapes take kernels/fp8_block_gemm.py.
Measured against that Triton GEMM and bf16 by examples/bench/fp8_gemm.py.
"""

from __future__ import annotations

import functools

import torch

from libvllm.kernels._common import FLOAT_DTYPES, check, check_same_device

FP8_DTYPE = torch.float8_e4m3fn


@functools.cache
def _device_has_scaled_mm(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (8, 9)


@functools.cache
def _device_has_block_scaled_mm(index: int) -> bool:
    """cuBLASLt's VEC128 / BLK128x128 scale modes: CUDA 12.9+ on sm_90 (Hopper), reached
    through torch._scaled_mm from torch 2.9."""
    cuda = tuple(int(v) for v in (torch.version.cuda or "0.0").split(".")[:2])
    version = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2])
    return (version >= (2, 9) and cuda >= (12, 9)
            and torch.cuda.get_device_capability(index) == (9, 0))


def block_scaled_mm_supported(x: torch.Tensor, b_q: torch.Tensor,
                              block: tuple[int, int] | list[int]) -> bool:
    """Whether fp8_block_scaled_mm takes x [M, K] against b_q [N, K] in [128, 128] blocks."""
    n, k = b_q.shape
    return (x.is_cuda and x.dtype == torch.bfloat16 and tuple(block) == (128, 128)
            and k % 512 == 0 and n % 16 == 0 and b_q.is_contiguous()
            and _device_has_block_scaled_mm(x.device.index or 0))


def scaled_mm_supported(a_q: torch.Tensor, b_q: torch.Tensor) -> bool:
    """Whether torch._scaled_mm takes a_q [M, K] @ b_q [N, K]^T on their device."""
    return (a_q.is_cuda and _device_has_scaled_mm(a_q.device.index or 0)
            and a_q.shape[1] % 16 == 0 and b_q.shape[0] % 16 == 0)


def _check_args(a_q: torch.Tensor, b_q: torch.Tensor, a_scale: torch.Tensor,
                b_scale: torch.Tensor, out_dtype: torch.dtype,
                bias: torch.Tensor | None) -> None:
    check(a_q.dtype == FP8_DTYPE and b_q.dtype == FP8_DTYPE,
          lambda: f"a_q and b_q must be float8_e4m3fn, got {a_q.dtype}, {b_q.dtype}")
    check(a_q.dim() == 2 and b_q.dim() == 2 and a_q.shape[1] == b_q.shape[1],
          lambda: f"a_q [M, K] and b_q [N, K] do not match: {tuple(a_q.shape)}, "
                  f"{tuple(b_q.shape)}")
    check(a_q.is_contiguous() and b_q.is_contiguous(), "a_q and b_q must be contiguous")
    m, n = a_q.shape[0], b_q.shape[0]
    for name, s, rows in (("a_scale", a_scale, m), ("b_scale", b_scale, n)):
        check(s.dtype == torch.float32 and (s.numel() == 1 or tuple(s.shape) == (rows, 1)),
              lambda name=name, s=s, rows=rows: f"{name} must be fp32 of one value or "
              f"[{rows}, 1], got {tuple(s.shape)} {s.dtype}")
    check(out_dtype in FLOAT_DTYPES,
          lambda: f"out_dtype must be float32, float16 or bfloat16, got {out_dtype}")
    check(bias is None or tuple(bias.shape) == (n,),
          lambda: f"bias must be [{n}], got {tuple(bias.shape)}")
    check_same_device(a_q=a_q, b_q=b_q, a_scale=a_scale, b_scale=b_scale)


def fp8_scaled_mm(a_q: torch.Tensor, b_q: torch.Tensor, a_scale: torch.Tensor,
                  b_scale: torch.Tensor, out_dtype: torch.dtype,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    """a_q [M, K] fp8, b_q [N, K] fp8, a_scale one value or [M, 1] fp32, b_scale one
    value or [N, 1] fp32, bias [N] -> [M, N] out_dtype."""
    _check_args(a_q, b_q, a_scale, b_scale, out_dtype, bias)
    m, n = a_q.shape[0], b_q.shape[0]
    if m == 0 or not scaled_mm_supported(a_q, b_q):
        return fp8_scaled_mm_ref(a_q, b_q, a_scale, b_scale, out_dtype, bias)
    if a_scale.numel() == 1 and b_scale.numel() == 1:  # per tensor
        fused_bias = bias is not None and bias.dtype == out_dtype != torch.float32
        out = torch._scaled_mm(a_q, b_q.t(), scale_a=a_scale.reshape(1),
                               scale_b=b_scale.reshape(1), out_dtype=out_dtype,
                               bias=bias if fused_bias else None)
        return out if bias is None or fused_bias else (out.float() + bias).to(out_dtype)
    sa = a_scale.reshape(-1, 1).expand(m, 1).contiguous()  # [M, 1]
    sb = b_scale.reshape(1, -1).expand(1, n).contiguous()  # [1, N]
    if out_dtype == torch.bfloat16:  # row-wise
        out = torch._scaled_mm(a_q, b_q.t(), scale_a=sa, scale_b=sb, out_dtype=out_dtype)
        return out if bias is None else (out.float() + bias).to(out_dtype)
    one = torch.ones(1, dtype=torch.float32, device=a_q.device)  # channel-wise
    out = torch._scaled_mm(a_q, b_q.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
    out = out * sa * sb
    return (out if bias is None else out + bias).to(out_dtype)


def fp8_scaled_mm_ref(a_q: torch.Tensor, b_q: torch.Tensor, a_scale: torch.Tensor,
                      b_scale: torch.Tensor, out_dtype: torch.dtype,
                      bias: torch.Tensor | None = None) -> torch.Tensor:
    """The dequantized fp32 matmul, rounded once: [M, N]."""
    a = a_q.float() * a_scale.float().reshape(-1, 1)  # [M, K]
    b = b_q.float() * b_scale.float().reshape(-1, 1)  # [N, K]
    out = a @ b.t()
    return (out if bias is None else out + bias.float()).to(out_dtype)


BLOCK_ROWS = 4  # cuBLASLt: the [1, 128] scales' column stride (the row count) 16-byte aligned


def fp8_block_scaled_mm(a_q: torch.Tensor, b_q: torch.Tensor, a_scale: torch.Tensor,
                        b_scale: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """a_q [Mp, K] fp8 (Mp % 4 == 0), a_scale [Mp, K / 128] fp32 column-major (a transposed
    contiguous tensor), b_q [N, K] fp8, b_scale [N / 128, K / 128] fp32 -> [Mp, N]."""
    check(a_q.shape[0] % BLOCK_ROWS == 0 and a_scale.stride(0) == 1,
          lambda: f"a_q rows must be a multiple of {BLOCK_ROWS} and a_scale column-major, "
                  f"got {tuple(a_q.shape)}, strides {a_scale.stride()}")
    return torch._scaled_mm(a_q, b_q.t(), scale_a=a_scale, scale_b=b_scale.contiguous().t(),
                            out_dtype=out_dtype)
