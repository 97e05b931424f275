"""The oracle of the fp8 KV-cache tests: transformers' sdpa attention over K and V rounded
through float8_e4m3fn (x / scale saturated to +-448, cast, times scale: the store and read
of vLLM's fp8 KV cache), written here in plain torch, independent of the engine's code.

`use_fp8_kv(hf, scales)` switches a transformers model to it (scales: {layer_idx: (k, v)},
default (1.0, 1.0)); `seen_kv_max` records max|k|, max|v| of each layer's first call (the
keys after RoPE: the oracle of calculate_kv_scales).
"""

from __future__ import annotations

import contextlib

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

_SCALES: dict[int, tuple[float, float]] = {}
seen_kv_max: dict[int, tuple[float, float]] = {}


def fp8_round(x: torch.Tensor, scale: float) -> torch.Tensor:
    """x through an fp8 cache: float8_e4m3fn(clamp(x / scale, +-448)) * scale, x's dtype."""
    q = (x.float() / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return (q.float() * scale).to(x.dtype)


def _fp8_kv_attention(module, query, key, value, attention_mask, **kwargs):
    seen_kv_max.setdefault(module.layer_idx, (key.abs().max().item(),
                                              value.abs().max().item()))
    ks, vs = _SCALES.get(module.layer_idx, (1.0, 1.0))
    return sdpa_attention_forward(module, query, fp8_round(key, ks), fp8_round(value, vs),
                                  attention_mask, **kwargs)


AttentionInterface.register("fp8_kv_oracle", _fp8_kv_attention)


@contextlib.contextmanager
def use_fp8_kv(hf, scales: dict[int, tuple[float, float]] | None = None):
    """hf's attention layers read K / V through fp8 within the block; restored after."""
    old = hf.config._attn_implementation
    _SCALES.clear()
    _SCALES.update(scales or {})
    seen_kv_max.clear()
    hf.set_attn_implementation("fp8_kv_oracle")
    try:
        yield
    finally:
        hf.set_attn_implementation(old)
