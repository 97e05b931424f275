"""engine/core/mamba_spec.py: GDN state shapes / dtypes, the state pool's bytes and vLLM's
hybrid page-size unification, checked against the block sizes vLLM logs (544 tokens for
Qwen3.5-0.8B, 528 for Qwen3.5-4B) and those its formula gives for the other models.

Mirrors vLLM 0.33 tests/v1/core/test_kv_cache_planning.py
(test_unify_kv_cache_spec_page_size_mamba) and the formulas of
vllm/model_executor/layers/mamba/mamba_utils.py / vllm/platforms/interface.py.
"""

from __future__ import annotations

import pytest
import torch

from engine.core.mamba_spec import (
    MambaSpec,
    align_hybrid_block_size,
    gdn_mamba_spec,
    mamba_state_bytes,
    num_attention_layers,
)
from engine.models.config import ModelArchConfig


def _cfg(layers: int, kv_heads: int, hk: int, hv: int, ssm_dtype: str | None) -> ModelArchConfig:
    return ModelArchConfig(
        "qwen3_5_text", "t", 1000, 1024, 0, layers, 16, kv_heads, 256, 1e-6, 1e7, 4096, False,
        layer_types=tuple("linear_attention" if (i + 1) % 4 else "full_attention"
                          for i in range(layers)),
        linear_num_key_heads=hk, linear_num_value_heads=hv, linear_key_head_dim=128,
        linear_value_head_dim=128, mamba_ssm_dtype=ssm_dtype)


# (name, layers, kv heads, Hk, Hv, mamba_ssm_dtype, conv bytes, ssm bytes, block size)
MODELS = [
    ("Qwen3.5-0.8B", 24, 2, 16, 16, "float32", 36_864, 1_048_576, 544),
    ("Qwen3.5-4B", 32, 4, 16, 32, "float32", 49_152, 2_097_152, 528),
    ("Qwen3-Next-80B", 48, 2, 16, 32, None, 49_152, 1_048_576, 544),
    ("Qwen3.5-35B-A3B", 40, 2, 16, 32, "float32", 49_152, 2_097_152, 1056),
    ("Qwen3.5-27B", 64, 4, 16, 48, "float32", 61_440, 3_145_728, 784),
]


@pytest.mark.parametrize("name,layers,kv,hk,hv,ssm,conv_b,ssm_b,block", MODELS)
def test_page_unification_matches_vllm(name, layers, kv, hk, hv, ssm, conv_b, ssm_b, block):
    cfg = _cfg(layers, kv, hk, hv, ssm)
    spec = gdn_mamba_spec(cfg, torch.bfloat16)
    conv, state = spec.shapes
    assert conv[1] * conv[0] * spec.dtypes[0].itemsize == conv_b
    assert state[0] * state[1] * state[2] * spec.dtypes[1].itemsize == ssm_b
    attn_bytes_per_token = 2 * kv * 256 * 2  # K and V, bf16
    got_block, padded = align_hybrid_block_size(attn_bytes_per_token, spec.page_size_bytes)
    assert got_block == block
    assert padded == block * attn_bytes_per_token >= spec.page_size_bytes
    padded_spec = MambaSpec(spec.shapes, spec.dtypes, page_size_padded=padded)
    assert padded_spec.page_size_bytes == padded


def test_state_pool_bytes_and_layer_counts():
    cfg = _cfg(40, 2, 16, 32, "float32")
    assert num_attention_layers(cfg) == 10
    # 30 GDN layers x (8 slots + the null slot) x (conv + ssm)
    assert mamba_state_bytes(cfg, torch.bfloat16, 8) == 30 * 9 * (49_152 + 2_097_152)


def test_ssm_dtype_follows_the_config():
    assert gdn_mamba_spec(_cfg(8, 2, 2, 4, None), torch.bfloat16).dtypes == (
        torch.bfloat16, torch.bfloat16)
    assert gdn_mamba_spec(_cfg(8, 2, 2, 4, "float32"), torch.bfloat16).dtypes == (
        torch.bfloat16, torch.float32)
