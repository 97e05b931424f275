"""kernels/rotary.py rotary_embedding (neox, in place) against the engine's RotaryEmbedding.

Oracle: rotary_embedding_ref = engine/layers/rotary_embedding.py RotaryEmbedding.forward
with the same cos/sin table. Mirrors vLLM 0.33 tests/kernels/core/test_pos_encoding.py
(test_rotary_embedding: head sizes, partial rotary_dim, q/k as views of a fused qkv
tensor, random positions).
"""

from __future__ import annotations

import pytest
import torch
from test_kernels_common import DEVICE, DTYPES, assert_close, gpu

from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.layers.rotary_embedding import RotaryEmbedding
from libvllm.kernels.rotary import rotary_embedding, rotary_embedding_ref


def _check(n: int, nq: int, nkv: int, hs: int, rot: int, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    table = RotaryEmbedding(hs, rot, 4096, 10000.0).cos_sin_cache.to(DEVICE)
    positions = torch.randint(0, 4096, (n,), device=DEVICE)
    qkv = torch.randn(n, (nq + 2 * nkv) * hs, dtype=dtype, device=DEVICE)
    q, k, _ = qkv.split([nq * hs, nkv * hs, nkv * hs], dim=-1)  # strided row views
    ref_q, ref_k = rotary_embedding_ref(positions, q, k, table, hs)
    rotary_embedding(positions, q, k, table, hs)
    assert_close(q, ref_q)
    assert_close(k, ref_k)


@pytest.mark.parametrize("nq,nkv", [(4, 4), (8, 2), (5, 1)])
@pytest.mark.parametrize("hs,rot", [(32, 32), (64, 32), (40, 40)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_matches_engine(nq: int, nkv: int, hs: int, rot: int, dtype) -> None:
    _check(3, nq, nkv, hs, rot, dtype)


def test_rotary_3d_views_and_int32_positions() -> None:
    torch.manual_seed(1)
    table = RotaryEmbedding(16, 16, 64, 500.0).cos_sin_cache.to(DEVICE)
    pos = torch.tensor([0, 5, 63], dtype=torch.int32, device=DEVICE)
    q = torch.randn(3, 4, 16, device=DEVICE)
    k = torch.randn(3, 2, 16, device=DEVICE)
    ref_q, ref_k = rotary_embedding_ref(pos.long(), q, k, table, 16)
    rotary_embedding(pos, q, k, table, 16)
    assert_close(q.reshape(3, -1), ref_q)
    assert_close(k.reshape(3, -1), ref_k)


def test_rotary_rejects_bad_input() -> None:
    table = torch.zeros(8, 16, device=DEVICE)
    pos = torch.zeros(2, dtype=torch.int64, device=DEVICE)
    q, k = torch.zeros(2, 64, device=DEVICE), torch.zeros(2, 32, device=DEVICE)
    with pytest.raises(InvalidArgumentError, match="rotary_dim 16 must be even and <= "):
        rotary_embedding(pos, q, k, table, 8)
    with pytest.raises(InvalidArgumentError, match="positions must be"):
        rotary_embedding(pos.float(), q, k, table, 16)
    with pytest.raises(InvalidArgumentError, match="cos_sin_cache must be"):
        rotary_embedding(pos, q, k, table.half(), 16)
    with pytest.raises(InvalidArgumentError, match=r"key must be \[2, heads \* 16\]"):
        rotary_embedding(pos, q, torch.zeros(2, 33, device=DEVICE), table, 16)


@gpu
@pytest.mark.parametrize("n", [1, 83, 4096])
@pytest.mark.parametrize("hs", [64, 128, 256])
def test_rotary_llama_shapes(n: int, hs: int) -> None:
    _check(n, 32, 8, hs, hs, torch.bfloat16)


@pytest.mark.parametrize("hs,rot", [(32, 32), (64, 32)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_ref_is_the_engine_torch_path(hs: int, rot: int, dtype) -> None:
    """The kernel's plain-torch reference equals engine/layers/rotary_embedding.py."""
    rope = RotaryEmbedding(hs, rot, 64, 10000.0)
    g = torch.Generator().manual_seed(3)
    positions = torch.randint(0, 64, (5,), generator=g)
    q = torch.randn(5, 4 * hs, generator=g).to(dtype)
    k = torch.randn(5, 2 * hs, generator=g).to(dtype)
    for got, want in zip(rotary_embedding_ref(positions, q, k, rope.cos_sin_cache, hs),
                         rope.forward_native(positions, q, k), strict=True):
        assert torch.equal(got, want)
