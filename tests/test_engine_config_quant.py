"""EngineConfig's quantization, KV-cache and Mamba-state dtype fields: vLLM's names and
values, and vLLM's errors for the rest (vllm/config/cache.py _validate_cache_dtype,
vllm/config/model.py quantization)."""

import pytest

from libvllm.engine.config import EngineConfig
from libvllm.engine.errors import InvalidArgumentError


def test_defaults_are_vllms():
    cfg = EngineConfig("m")
    assert (cfg.quantization, cfg.kv_cache_dtype, cfg.calculate_kv_scales) == \
        (None, "auto", False)
    assert (cfg.mamba_cache_dtype, cfg.mamba_ssm_cache_dtype, cfg.mamba_cache_mode) == \
        ("auto", "auto", None)


@pytest.mark.parametrize("fields", [
    {"quantization": "fp8"}, {"quantization": "compressed-tensors"},
    {"kv_cache_dtype": "fp8"}, {"kv_cache_dtype": "fp8_e4m3"},
    {"mamba_ssm_cache_dtype": "float32"}, {"mamba_cache_dtype": "bfloat16"},
    {"mamba_cache_mode": "align"}, {"mamba_cache_mode": "none"},
])
def test_supported_values_accepted(fields):
    cfg = EngineConfig("m", **fields)
    assert all(getattr(cfg, k) == v for k, v in fields.items())


@pytest.mark.parametrize("fields, message", [
    ({"quantization": "awq"}, "Unknown quantization method: 'awq'"),
    ({"kv_cache_dtype": "fp8_e5m2"}, "Invalid kv_cache_dtype: 'fp8_e5m2'"),
    ({"kv_cache_dtype": ""}, "Invalid kv_cache_dtype: ''"),
    ({"mamba_ssm_cache_dtype": "fp8"}, "mamba_ssm_cache_dtype must be one of"),
    ({"mamba_cache_mode": "all"}, "mamba_cache_mode must be none or align"),
])
def test_unsupported_values_refused(fields, message):
    with pytest.raises(InvalidArgumentError, match=message):
        EngineConfig("m", **fields)
