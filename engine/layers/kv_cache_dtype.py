"""The KV-cache dtype (vLLM's --kv-cache-dtype), its fp8 quantization rule in torch, and
the k/v scales derived from data (vLLM's --calculate-kv-scales).

Mirrors vllm/config/cache.py (cache_dtype: "auto" is the model dtype; "fp8" means
"fp8_e4m3"), vllm/utils/torch_utils.py (STR_DTYPE_TO_TORCH_DTYPE: vLLM keeps fp8 caches as
uint8 bytes viewed as float8_e4m3fn in its kernels; here the tensor is float8_e4m3fn), the
store / read of vllm/v1/attention/ops/triton_reshape_and_cache_flash.py (x / scale, cast to
e4m3 with saturation at +-448) and triton_unified_attention.py (_cast_kv_tile: fp8 * scale
in fp32, rounded to the query dtype), and the calc_kv_scales of vLLM's Attention layer
(vllm/attention/layer.py in the releases that have --calculate-kv-scales; vLLM 0.33 keeps
the config field only): k_scale = max|k| / K_SCALE_CONSTANT, v_scale = max|v| /
V_SCALE_CONSTANT (vllm/envs.py: 200 and 100), once, from the first forward with tokens.
kernels/reshape_and_cache.py holds the same rule for the kernels (kernels/ imports nothing
from engine/); tests/test_kv_fp8.py checks the two agree.
"""

from __future__ import annotations

import torch

from libvllm.engine.errors import InvalidArgumentError

FP8_KV_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
K_SCALE_CONSTANT = 200.0  # vLLM envs.K_SCALE_CONSTANT: k_scale = max|k| / this
V_SCALE_CONSTANT = 100.0  # vLLM envs.V_SCALE_CONSTANT
_FP8_NAMES = ("fp8", "fp8_e4m3")


def is_quantized_kv_cache(kv_cache_dtype: str) -> bool:
    """vLLM's is_quantized_kv_cache: every cache dtype but "auto" here."""
    return kv_cache_dtype != "auto"


def kv_cache_torch_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The KV tensors' dtype: "auto" -> the model dtype, "fp8" / "fp8_e4m3" ->
    float8_e4m3fn (one byte an element: twice the blocks of a 16-bit cache)."""
    if kv_cache_dtype == "auto":
        return model_dtype
    if kv_cache_dtype in _FP8_NAMES:
        return FP8_KV_DTYPE
    raise InvalidArgumentError(f"Invalid kv_cache_dtype: {kv_cache_dtype!r}. Valid values "
                               f"are: {['auto', *_FP8_NAMES]}")


def quantize_kv(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x (any float) -> float8_e4m3fn: x / scale in fp32, saturated to +-448, rounded to
    nearest even (the cast of vLLM's fp8 store)."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_KV_DTYPE)


def dequantize_kv(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An fp8 cache read: x * scale in fp32, rounded to dtype."""
    return (x.float() * scale).to(dtype)


def calc_kv_scales(k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor,
                   k_scale: torch.Tensor, v_scale: torch.Tensor, pending: torch.Tensor) -> None:
    """While `pending` (a [] bool device flag) holds, set k_scale / v_scale from this
    step's keys and values (k, v: [T, nkv, hd]; rows with slot < 0 are CUDA-graph padding
    and do not count) and clear the flag once a step had tokens. Device ops only: no host
    sync, and a CUDA graph may capture it. A zero max keeps the scale (no division by 0)."""
    real = (slot_mapping >= 0)[:, None, None]  # [T, 1, 1]
    has_tokens = real.any()
    for x, scale, rng in ((k, k_scale, K_SCALE_CONSTANT), (v, v_scale, V_SCALE_CONSTANT)):
        amax = torch.where(real, x.abs(), 0).amax().float()
        scale.copy_(torch.where(pending & has_tokens & (amax > 0), amax / rng, scale))
    pending &= ~has_tokens
