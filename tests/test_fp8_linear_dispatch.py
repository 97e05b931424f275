"""Which kernel a block-FP8 linear runs (engine/layers/quantization/fp8_utils.py
apply_fp8_linear): one row on the GEMV inside w8a8_block_fp8_matmul, two or more on
cuBLASLt's block-scaled GEMM where block_scaled_mm_supported holds (rows padded to 4,
column-major scales, the padding sliced off), else the Triton GEMM. As vLLM's
W8A8BlockFp8LinearOp dispatch (vllm/model_executor/layers/quantization/utils/fp8_utils.py):
the kernels are replaced by recorders, so this runs on CPU."""

from __future__ import annotations

import pytest
import torch

from libvllm.engine.layers.quantization import fp8_utils
from libvllm.engine.layers.quantization.base_config import WeightScheme
from libvllm.kernels import fp8_block_gemm, fp8_quant, fp8_scaled_mm

N, K = 256, 512
SCHEME = WeightScheme(kind="block", block=(128, 128))


@pytest.fixture
def calls(monkeypatch):
    seen: list[tuple] = []

    def quant(x, group, column_major_scales=False, row_multiple=1):
        rows = -(-x.shape[0] // row_multiple) * row_multiple
        seen.append(("quant", rows, column_major_scales))
        scales = torch.ones(K // group, rows).t() if column_major_scales else \
            torch.ones(rows, K // group)
        return torch.zeros(rows, K), scales

    def cublas(a_q, b_q, a_s, b_s, out_dtype):
        seen.append(("cublas", a_q.shape[0], a_s.stride()))
        return torch.arange(a_q.shape[0], dtype=out_dtype).reshape(-1, 1).expand(-1, N)

    def triton(a_q, b_q, a_s, b_s, block, out_dtype):
        seen.append(("triton", a_q.shape[0]))
        return torch.zeros(a_q.shape[0], N, dtype=out_dtype)

    monkeypatch.setattr(fp8_quant, "per_token_group_quant_fp8", quant)
    monkeypatch.setattr(fp8_scaled_mm, "fp8_block_scaled_mm", cublas)
    monkeypatch.setattr(fp8_block_gemm, "w8a8_block_fp8_matmul", triton)
    return seen


def _apply(m: int) -> torch.Tensor:
    x = torch.randn(m, K, dtype=torch.bfloat16)
    return fp8_utils.apply_fp8_linear(SCHEME, x, torch.zeros(N, K), torch.ones(2, 4), None,
                                      None)


@pytest.mark.parametrize("m,rows", [(2, 4), (5, 8), (8, 8)])
def test_two_rows_or_more_take_cublas_on_padded_rows(calls, monkeypatch, m, rows):
    monkeypatch.setattr(fp8_scaled_mm, "block_scaled_mm_supported", lambda x, w, b: True)
    out = _apply(m)
    assert calls == [("quant", rows, True), ("cublas", rows, (1, rows))]
    assert out.shape == (m, N)  # the padded rows sliced off
    assert torch.equal(out[:, 0], torch.arange(m, dtype=torch.bfloat16))


def test_one_row_takes_the_gemv_path(calls, monkeypatch):
    monkeypatch.setattr(fp8_scaled_mm, "block_scaled_mm_supported", lambda x, w, b: True)
    _apply(1)
    assert calls == [("quant", 1, False), ("triton", 1)]


def test_unsupported_shapes_take_the_triton_gemm(calls):
    _apply(16)  # CPU tensors: block_scaled_mm_supported is False
    assert calls == [("quant", 16, False), ("triton", 16)]


def test_supported_is_false_off_cuda():
    w = torch.zeros(N, K)
    x = torch.zeros(4, K, dtype=torch.bfloat16)
    assert not fp8_scaled_mm.block_scaled_mm_supported(x, w, (128, 128))  # CPU
