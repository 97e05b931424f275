"""Per-layer KV-cache scales: the checkpoint's k_scale / v_scale tensors and the
processing that picks each attention layer's scales once the cache dtype is known.

Mirrors vllm/model_executor/model_loader/weight_utils.py maybe_remap_kv_scale_name (the
checkpoint names: `.self_attn.{k,v}_scale`, ModelOpt `.self_attn.{k,v}_proj.{k,v}_scale`,
`.self_attn.qkv_proj.{k,v}_scale`, compressed-tensors `.self_attn.{k,v}_proj.output_scale`,
the deprecated `.kv_scale` read as k_scale) and
vllm/model_executor/layers/quantization/kv_cache.py (KVCacheScaleParameter: a scalar, -1.0
until loaded; BaseKVCacheMethod.process_weights_after_loading: with a quantized cache, both
scales loaded -> used, none -> 1.0 with vLLM's warning, one (kv_scale) -> duplicated; with
kv_cache_dtype auto the scales are 1.0 whatever the checkpoint holds). With
calculate_kv_scales the checkpoint's are not processed: the first forward computes them
(engine/layers/kv_cache_dtype.py calc_kv_scales). q_scale / prob_scale (fp8 attention
backends' query and softmax scales) are read and not used: attention runs in the
activation dtype here.
"""

from __future__ import annotations

import logging
import re

import torch
from torch import nn

from libvllm.engine.errors import ModelLoadError
from libvllm.engine.layers.attention import Attention
from libvllm.engine.layers.kv_cache_dtype import is_quantized_kv_cache, kv_cache_torch_dtype

logger = logging.getLogger(__name__)

# (checkpoint suffix, the attention module's k_scale / v_scale / q_scale name), in order
_SCALE_NAMES = [
    (r"\.self_attn\.([kv])_proj\.([kv])_scale$", r".self_attn.attn.\2_scale"),
    (r"\.self_attn\.qkv_proj\.([kv])_scale$", r".self_attn.attn.\1_scale"),
    (r"\.self_attn\.([kv])_proj\.output_scale$", r".self_attn.attn.\1_scale"),
    (r"\.kv_scale$", r".attn.k_scale"),
    (r"\.attn\.(q|k|v|prob)_scale$", r".attn.\1_scale"),
    (r"\.(q|k|v|prob)_scale$", r".attn.\1_scale"),
]


def load_kv_scale(model: nn.Module, name: str, w: torch.Tensor) -> bool:
    """Whether checkpoint tensor `name` is a KV-cache scale (then it is taken: k / v into
    its attention layer's checkpoint_kv_scales; q / prob read and dropped); a scale whose
    layer is not an attention module is dropped with vLLM's warning."""
    for pattern, repl in _SCALE_NAMES:
        if re.search(pattern, name):
            target = re.sub(pattern, repl, name)
            break
    else:
        return False
    path, _, which = target.rpartition(".")
    try:
        layer = model.get_submodule(path)
    except AttributeError:
        layer = None
    if not isinstance(layer, Attention):
        logger.warning("Found %s in the checkpoint, but not found the expected name in the "
                       "model (e.g. %s). %s is not loaded.", name, target, which)
        return True
    if w.numel() != 1:
        raise ModelLoadError(f"{name}: KV-cache scale expects a scalar weight, got shape "
                             f"{tuple(w.shape)}")
    if which in ("k_scale", "v_scale"):
        layer.checkpoint_kv_scales[which == "v_scale"] = float(w.reshape(()))
    return True


def _layer_scales(layer: Attention) -> tuple[float, float]:
    """vLLM's process_weights_after_loading of a quantized cache: (k_scale, v_scale)."""
    k, v = layer.checkpoint_kv_scales
    if k > 0.0 and v > 0.0:
        return k, v
    if k < 0.0 and v < 0.0:
        return 1.0, 1.0
    one = max(k, v)  # a single kv_scale: duplicated
    return one, one


def configure_kv_cache(model: nn.Module, kv_cache_dtype: str, calculate_kv_scales: bool,
                       model_dtype: torch.dtype) -> torch.dtype:
    """Give every attention layer of `model` its k/v scales for `kv_cache_dtype` (engine
    config kv_cache_dtype / calculate_kv_scales); -> the dtype of the KV tensors. Hybrid
    models: only the attention layers are touched (the Gated DeltaNet state keeps its own
    dtype)."""
    dtype = kv_cache_torch_dtype(kv_cache_dtype, model_dtype)
    quantized = is_quantized_kv_cache(kv_cache_dtype)
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    loaded = any(max(layer.checkpoint_kv_scales) > 0.0 for layer in layers)
    if loaded and not quantized:
        logger.warning("The checkpoint's k_scale / v_scale are ignored: kv_cache_dtype is "
                       "auto, so the KV cache is not quantized.")
    for layer in layers:
        layer.calculate_kv_scales = quantized and calculate_kv_scales
        layer.kv_scale_values = _layer_scales(layer) \
            if quantized and not calculate_kv_scales else (1.0, 1.0)
        layer.kv_cache = layer.kv_cache  # a bound cache: its scale tensors anew
    if quantized and not calculate_kv_scales and any(
            layer.kv_scale_values == (1.0, 1.0) for layer in layers):
        logger.warning("Using KV cache scaling factor 1.0 for fp8_e4m3. If this is "
                       "unintended, verify that k/v_scale scaling factors are properly "
                       "set in the checkpoint.")
    return dtype
