"""kernels/rms_norm_gated.py against its torch form and transformers' Qwen3NextRMSNormGated.

Mirrors vLLM 0.33 tests/kernels/mamba/test_layernorm_gated.py (RMSNormGated with
norm_before_gate and a SiLU gate z against rms_norm_ref, fp32 and 16-bit, group = the head)
with the engine's layout: x the delta rule's [T, Hv, dv] output, z a strided view of the
in-projection's output. On CPU the kernel runs under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import pytest
import torch
from test_kernels_common import DEVICE, DTYPES, gpu

from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.layers.gdn import RMSNormGated
from libvllm.kernels.rms_norm_gated import rms_norm_gated, rms_norm_gated_ref

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def _inputs(T: int, H: int, D: int, dtype: torch.dtype, seed: int = 0):
    """x [T, H, D] contiguous; z [T, H, D] a view of a wider row, as the layer's split."""
    torch.manual_seed(seed)
    x = (torch.randn(T, H, D, device=DEVICE) * 3).to(dtype)
    wide = torch.randn(T, 3 * H * D + 5, device=DEVICE).to(dtype)
    z = wide[:, 2 * H * D + 5:].view(T, H, D)
    w = (torch.rand(D, device=DEVICE) + 0.5).to(dtype)
    return x, z, w


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,H,D", [(1, 4, 16), (5, 3, 24), (2, 32, 128)])
def test_rms_norm_gated_matches_torch(T, H, D, dtype) -> None:
    x, z, w = _inputs(T, H, D, dtype)
    assert T == 1 or z.stride(0) == 3 * H * D + 5  # strided rows
    out = rms_norm_gated(x, z, w, 1e-6)
    assert out.shape == (T, H * D) and out.dtype == dtype and out.is_contiguous()
    ref = rms_norm_gated_ref(x, z, w, 1e-6).view(T, H * D)
    torch.testing.assert_close(out.float(), ref.float(), atol=TOL[dtype], rtol=TOL[dtype])


def test_rms_norm_gated_strided_x() -> None:
    """x with a token stride past its heads (a slice of a wider output) reads the same."""
    x, z, w = _inputs(3, 4, 16, torch.float32, seed=1)
    wide = torch.randn(3, 4, 20, device=DEVICE)
    wide[..., :16] = x
    out = rms_norm_gated(wide[..., :16], z, w, 1e-5)
    torch.testing.assert_close(out, rms_norm_gated_ref(x, z, w, 1e-5).view(3, -1),
                               atol=1e-5, rtol=1e-5)


def test_ref_is_the_layer_cpu_path_and_transformers() -> None:
    hf = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    x, z, w = (t.cpu() for t in _inputs(3, 4, 16, torch.float32, seed=2))
    layer = RMSNormGated(16, 1e-6)
    layer.weight.data.copy_(w)
    ref = hf.Qwen3NextRMSNormGated(16, eps=1e-6)
    ref.weight.data.copy_(w)
    want = ref(x.reshape(-1, 16), z.reshape(-1, 16)).view(3, 64)
    torch.testing.assert_close(layer(x, z), want)
    torch.testing.assert_close(rms_norm_gated_ref(x, z, w, 1e-6).view(3, 64), want)


def test_rms_norm_gated_rejects_bad_inputs() -> None:
    x, z, w = _inputs(2, 4, 16, torch.float32)
    with pytest.raises(InvalidArgumentError, match="x and z must be"):
        rms_norm_gated(x, z[:, :2], w, 1e-6)
    with pytest.raises(InvalidArgumentError, match="weight must be"):
        rms_norm_gated(x, z, w[:8], 1e-6)
    with pytest.raises(InvalidArgumentError, match="weight must be"):
        rms_norm_gated(x, z, w.half(), 1e-6)


@gpu
def test_rms_norm_gated_real_shapes_bf16() -> None:
    """Qwen3.5-35B-A3B's norm (32 value heads of 128) over a decode batch and a prefill."""
    for T in (1, 37, 1024):
        x, z, w = _inputs(T, 32, 128, torch.bfloat16, seed=T)
        out = rms_norm_gated(x, z, w, 1e-6)
        ref = rms_norm_gated_ref(x, z, w, 1e-6).view(T, -1)
        # same roundings: a bf16 ulp or two apart (rsqrt and sigmoid approximations)
        torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
