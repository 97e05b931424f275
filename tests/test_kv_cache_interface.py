"""engine/core/kv_cache_interface.py and the hybrid layout of engine/worker/mamba_utils.py:
GDN state shapes / dtypes, vLLM's page-size unification, the layer grouping and the
views of the shared buffers.

Mirrors vLLM 0.33 tests/v1/core/test_kv_cache_utils.py / test_kv_cache_planning.py
(page unification of attention + mamba specs, grouping layers into KV cache groups of
equal page size) with the formulas of vllm/model_executor/layers/mamba/mamba_utils.py and
vllm/platforms/interface.py (_align_hybrid_block_size). The oracle for the block sizes is
that formula written out in _vllm_block_size below; 544 (Qwen3.5-0.8B) and 528 (4B) are
also the sizes vLLM logs ("Setting attention block size to ... tokens").
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from libvllm.engine.core.kv_cache_interface import (
    FullAttentionSpec,
    MambaSpec,
    gated_delta_net_state_dtype,
    unify_hybrid_specs,
)
from libvllm.engine.core.kv_cache_utils import group_hybrid_layers
from libvllm.engine.model_loader.hf_config import arch_config_from_hf
from libvllm.engine.models.config import ModelArchConfig
from libvllm.engine.worker.mamba_utils import (
    allocate_hybrid_kv_cache,
    attention_view,
    gdn_mamba_spec,
    hybrid_kv_cache_config,
    state_views,
)

ROOT = Path(__file__).resolve().parents[1]


def _cfg(layers: int, kv_heads: int, hk: int, hv: int, ssm_dtype: str | None,
         head_dim: int = 256, lk: int = 128, lv: int = 128) -> ModelArchConfig:
    return ModelArchConfig(
        "qwen3_5_text", "t", 1000, 1024, 0, layers, 16, kv_heads, head_dim, 1e-6, 1e7, 4096,
        False, layer_types=tuple("linear_attention" if (i + 1) % 4 else "full_attention"
                                 for i in range(layers)),
        linear_num_key_heads=hk, linear_num_value_heads=hv, linear_key_head_dim=lk,
        linear_value_head_dim=lv, mamba_ssm_dtype=ssm_dtype)


def _vllm_block_size(cfg: ModelArchConfig, itemsize: int, block_size: int = 16) -> int:
    """_align_hybrid_block_size written out: alignment max(16, block_size), attention page
    of one token 2 * kv heads * head_dim * itemsize, state page conv + ssm bytes."""
    conv_dim = 2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim \
        + cfg.linear_num_value_heads * cfg.linear_value_head_dim
    ssm_item = 4 if cfg.mamba_ssm_dtype == "float32" else itemsize
    mamba_page = (cfg.linear_conv_kernel_dim - 1) * conv_dim * itemsize + \
        cfg.linear_num_value_heads * cfg.linear_value_head_dim * cfg.linear_key_head_dim \
        * ssm_item
    align = max(16, block_size)
    one = 2 * cfg.num_key_value_heads * cfg.head_dim * itemsize
    return align * math.ceil(mamba_page / (align * one))


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
    assert conv[0] * conv[1] * spec.dtypes[0].itemsize == conv_b
    assert state[0] * state[1] * state[2] * spec.dtypes[1].itemsize == ssm_b
    assert block == _vllm_block_size(cfg, 2)
    hybrid = hybrid_kv_cache_config(cfg, torch.bfloat16, 16)
    assert hybrid.attn_spec.block_size == block
    assert hybrid.mamba_spec.page_size_bytes == hybrid.attn_spec.page_size_bytes \
        == block * 2 * kv * 256 * 2 >= conv_b + ssm_b
    # one attention layer per 3 GDN layers: one attention group, three GDN groups
    assert hybrid.group_size == layers // 4 and len(hybrid.mamba_groups) == 3


@pytest.mark.parametrize("model", ["qwen3.5-35b-a3b", "qwen3.5-27b"])
def test_bench_model_configs(model):
    """The benchmark's config.json files through the loader's config parser."""
    raw = json.loads((ROOT / "examples/bench/models" / model / "config.json").read_text())
    cfg = arch_config_from_hf(raw, raw["architectures"][0], model)
    hybrid = hybrid_kv_cache_config(cfg, torch.bfloat16, 16)
    assert hybrid.attn_spec.block_size == _vllm_block_size(cfg, 2) \
        == {"qwen3.5-35b-a3b": 1056, "qwen3.5-27b": 784}[model]
    # bytes a request's state takes: 3 GDN groups x group_size layers x one page
    per_request = len(hybrid.mamba_groups) * hybrid.block_bytes
    unpadded = MambaSpec(hybrid.mamba_spec.shapes, hybrid.mamba_spec.dtypes)
    raw_state = sum(t == "linear_attention" for t in cfg.layer_types) \
        * unpadded.page_size_bytes
    assert raw_state <= per_request < 1.01 * raw_state  # padding under 1%


def test_tiny_test_config_raises_block_size():
    """The tests' tiny models (test_models_hybrid_gdn.py COMMON): 3,200-byte fp32 state,
    256 bytes a token of attention: 16 tokens (the alignment) from a configured 8; a
    configured 32 stays (the alignment becomes 32)."""
    cfg = _cfg(8, 2, 2, 4, None, head_dim=16, lk=16, lv=8)
    assert gdn_mamba_spec(cfg, torch.float32).page_size_bytes == 3 * 96 * 4 + 4 * 8 * 16 * 4
    assert hybrid_kv_cache_config(cfg, torch.float32, 8).attn_spec.block_size == 16
    assert hybrid_kv_cache_config(cfg, torch.float32, 32).attn_spec.block_size == 32
    assert _vllm_block_size(cfg, 4, 32) == 32


def test_unify_pads_the_state_page():
    attn = FullAttentionSpec(16, 2, 16, torch.float32)  # 256 bytes a token
    mamba = MambaSpec(((3, 96), (4, 8, 16)), (torch.float32, torch.float32))
    a, m = unify_hybrid_specs(attn, mamba)
    assert (a.block_size, a.page_size_bytes, m.page_size_bytes) == (16, 4096, 4096)
    assert m.page_size_padded == 4096


def test_state_dtypes():
    """vLLM's _mamba_state_dtype: conv in mamba_cache_dtype (auto: model dtype), SSM in
    mamba_ssm_cache_dtype (auto: the conv dtype; the model config's mamba_ssm_dtype is
    applied first, as vLLM's Qwen3.5 config update does)."""
    bf16, f32 = torch.bfloat16, torch.float32
    assert gated_delta_net_state_dtype(bf16) == (bf16, bf16)
    assert gated_delta_net_state_dtype(bf16, "float32") == (f32, f32)
    assert gated_delta_net_state_dtype(bf16, "auto", "float16") == (bf16, torch.float16)
    assert gdn_mamba_spec(_cfg(8, 2, 2, 4, None), bf16).dtypes == (bf16, bf16)
    assert gdn_mamba_spec(_cfg(8, 2, 2, 4, "float32"), bf16).dtypes == (bf16, f32)
    assert gdn_mamba_spec(_cfg(8, 2, 2, 4, "float32"), bf16, "auto", "bfloat16").dtypes \
        == (bf16, bf16)


def test_group_hybrid_layers():
    """_get_kv_cache_groups_uniform_page_size: group size = the smaller count (the larger
    below 1.5x), layers i::num_groups, short groups padded."""
    assert group_hybrid_layers(10, 30) == (
        (tuple(range(10)),), tuple(tuple(range(i, 30, 3)) for i in range(3)))
    assert group_hybrid_layers(2, 6) == (((0, 1),), ((0, 3), (1, 4), (2, 5)))
    assert group_hybrid_layers(1, 3) == (((0,),), ((0,), (1,), (2,)))
    assert group_hybrid_layers(2, 5) == (((0, 1),), ((0, 3), (1, 4), (2, -1)))
    assert group_hybrid_layers(4, 5) == (((0, 1, 2, 3, -1),), ((0, 1, 2, 3, 4),))


def test_views_share_pages_without_overlap():
    """Block b of every view lies in page b of its buffer: writing the state of block 2
    touches only bytes [2 * page, 3 * page), K and V of block 3 only page 3."""
    cfg = _cfg(8, 2, 2, 4, "float32", head_dim=16, lk=16, lv=8)
    hybrid = replace(hybrid_kv_cache_config(cfg, torch.bfloat16, 16), num_blocks=5)
    page = hybrid.page_size_bytes
    buf = allocate_hybrid_kv_cache(hybrid, torch.device("cpu"))[0]
    conv, ssm = state_views(buf, hybrid.mamba_spec, 5)
    kv = attention_view(buf, hybrid.attn_spec, 5)
    conv[2].fill_(1.0)
    ssm[2].fill_(2.0)
    touched = buf.nonzero().flatten()
    assert touched.min() >= 2 * page and touched.max() < 3 * page
    buf.zero_()
    kv[:, 3].fill_(1.0)
    touched = buf.nonzero().flatten()
    assert touched.min() == 3 * page and touched.max() == 4 * page - 1
    # bf16: 576 conv + 2,048 fp32 SSM bytes > 16 tokens x 128 bytes: 32-token blocks
    assert kv.shape == (2, 5, 32, 2, 16) and ssm.shape == (5, 4, 8, 16)
