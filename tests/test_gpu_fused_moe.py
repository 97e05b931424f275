"""The sync-free MoE expert paths of the CUDA runner against the host path (fused_experts).

fused_experts_grouped (torch._grouped_mm, bf16; what CUDA runs) and fused_experts_dense
(every expert over every token; CUDA in other dtypes) must give fused_experts' result on
the same routing. Runs on CPU (torch's grouped GEMM has a CPU kernel) and, when present,
on CUDA. Mirrors vLLM 0.33 tests/kernels/moe/test_moe.py (fused_moe vs torch_moe).
"""

from __future__ import annotations

import pytest
import torch

from libvllm.engine.layers.activation import SiluAndMul
from libvllm.engine.layers.fused_moe import (
    fused_experts,
    fused_experts_dense,
    fused_experts_grouped,
)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def moe_inputs(n: int, device: str, dtype: torch.dtype, e: int = 16, h: int = 256,
               i: int = 128, k: int = 4):
    g = torch.Generator(device=device).manual_seed(n)
    kw = dict(device=device, generator=g)
    x = torch.randn(n, h, **kw).to(dtype)
    w13 = (torch.randn(e, 2 * i, h, **kw) / 16).to(dtype)
    w2 = (torch.randn(e, h, i, **kw) / 16).to(dtype)
    ids = torch.rand(n, e, **kw).topk(k, dim=-1).indices  # distinct experts per token
    return x, w13, w2, torch.rand(n, k, **kw), ids


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [1, 5, 64])
def test_grouped_gemm_experts_match_the_host_path(device, n):
    args = moe_inputs(n, device, torch.bfloat16)
    assert rel_err(fused_experts_grouped(*args, SiluAndMul()),
                   fused_experts(*args, SiluAndMul())) < 2e-2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [1, 7])
def test_dense_experts_match_the_host_path(device, n):
    args = moe_inputs(n, device, torch.float32)
    assert rel_err(fused_experts_dense(*args, SiluAndMul()),
                   fused_experts(*args, SiluAndMul())) < 1e-5
