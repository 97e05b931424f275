"""Rotary position embedding (NeoX / rotate-half layout) and its scaling variants.

Mirrors vllm/model_executor/layers/rotary_embedding/{base,linear_scaling_rope,llama3_rope,
yarn_scaling_rope}.py and get_rope() in its __init__.py: one class per `rope_type`, each
overriding `_compute_inv_freq`; get_rope shares one instance per distinct parameter set
(vLLM's _ROPE_DICT), so layers share one table. `freq_factors` is llama.cpp's
`rope_freqs` tensor (GGUF Llama 3): each inverse frequency is divided by its factor.

`cos_sin_cache` is [max_position, rotary_dim] fp32 (cos half, then sin half), the layout
kernels/rotary.py reads. It is a plain attribute, not a buffer, so model.to(bfloat16)
cannot round it; a copy per device is made on first use there and kept (get_rope shares
one instance between models, and a CUDA graph keeps the address it captured). GGUF llama weights are
stored permuted for ggml's interleaved rope; the loader un-permutes Q/K so every model
here uses the rotate-half form. On CUDA, forward rotates q and k in place with the Triton
kernel kernels/rotary.py (vLLM's forward_cuda -> ops.rotary_embedding); the torch form is
the CPU path and the kernel's reference.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from libvllm.engine.errors import ModelLoadError, UnsupportedError

MAX_TABLE_ELEMENTS = 1 << 28  # 1 GiB of fp32: 1M positions x 256 rotary dims


class RotaryEmbedding(nn.Module):
    def __init__(self, head_size: int, rotary_dim: int, max_position: int, base: float,
                 freq_factors: list[float] | None = None) -> None:
        super().__init__()
        if max_position * rotary_dim > MAX_TABLE_ELEMENTS or not 0 < rotary_dim <= head_size \
                or rotary_dim % 2:
            raise ModelLoadError(f"rotary table of {max_position} positions x {rotary_dim} dims "
                                 f"(head size {head_size}) is out of bounds")
        self.head_size = head_size
        self.rotary_dim = rotary_dim
        self.max_position_embeddings = max_position
        self.base = base
        self.freq_factors = freq_factors
        self.cos_sin_cache = self._compute_cos_sin_cache()
        self._device_tables: dict[torch.device, torch.Tensor] = {}

    def _compute_inv_freq(self, base: float) -> torch.Tensor:
        # explicit device: real values even while a model is probed on the meta device
        exponent = torch.arange(0, self.rotary_dim, 2, dtype=torch.float,
                                device="cpu") / self.rotary_dim
        return 1.0 / (base**exponent)  # [rotary_dim / 2]

    def _mscale(self) -> float:
        return 1.0

    def _compute_cos_sin_cache(self) -> torch.Tensor:
        inv_freq = self._compute_inv_freq(self.base)
        if self.freq_factors is not None:
            inv_freq = inv_freq / torch.tensor(self.freq_factors, dtype=torch.float,
                                               device="cpu")
        t = torch.arange(self.max_position_embeddings, dtype=torch.float, device="cpu")
        freqs = torch.outer(t, inv_freq)  # [max_position, rotary_dim / 2]
        return torch.cat((freqs.cos(), freqs.sin()), dim=-1) * self._mscale()

    def cos_sin_cache_on(self, device: torch.device) -> torch.Tensor:
        """cos_sin_cache on `device` (a kept copy when it lives elsewhere)."""
        if self.cos_sin_cache.device == device:
            return self.cos_sin_cache
        if device not in self._device_tables:
            self._device_tables[device] = self.cos_sin_cache.to(device)
        return self._device_tables[device]

    def _cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # [num_tokens, 1, rotary_dim / 2] each
        return self.cos_sin_cache_on(positions.device)[positions].unsqueeze(1).chunk(2, dim=-1)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x: [num_tokens, num_heads, head_size]; cos/sin: [num_tokens, 1, rotary_dim / 2]
        rot, rest = x[..., : self.rotary_dim], x[..., self.rotary_dim :]
        x1, x2 = rot.float().chunk(2, dim=-1)
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)
        return torch.cat((out, rest), dim=-1) if rest.numel() else out

    def forward(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: [num_tokens]; query: [num_tokens, nq * head]; key: [num_tokens, nkv * head]
        if query.is_cuda:
            from libvllm.kernels.rotary import rotary_embedding  # lazy: kernels import this module

            rotary_embedding(positions, query, key, self.cos_sin_cache_on(positions.device),
                             self.head_size)
            return query, key
        return self.forward_native(positions, query, key)

    def forward_native(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The torch form (out of place): the CPU path and the kernel's reference."""
        cos, sin = self._cos_sin(positions)
        n = positions.shape[0]
        q = self._rotate(query.view(n, -1, self.head_size), cos, sin)
        k = self._rotate(key.view(n, -1, self.head_size), cos, sin)
        return q.reshape(n, -1), k.reshape(n, -1)


class LinearScalingRotaryEmbedding(RotaryEmbedding):
    def __init__(self, head_size: int, rotary_dim: int, max_position: int, base: float,
                 scaling_factor: float, **kw) -> None:
        self.scaling_factor = scaling_factor
        super().__init__(head_size, rotary_dim, max_position, base, **kw)

    def _compute_inv_freq(self, base: float) -> torch.Tensor:
        return super()._compute_inv_freq(base) / self.scaling_factor


class Llama3RotaryEmbedding(RotaryEmbedding):
    def __init__(self, head_size: int, rotary_dim: int, max_position: int, base: float,
                 scaling_factor: float, low_freq_factor: float, high_freq_factor: float,
                 orig_max_position: int, **kw) -> None:
        self.scaling_factor = scaling_factor
        self.low_freq_factor = low_freq_factor
        self.high_freq_factor = high_freq_factor
        self.orig_max_position = orig_max_position
        super().__init__(head_size, rotary_dim, max_position, base, **kw)

    def _compute_inv_freq(self, base: float) -> torch.Tensor:
        inv_freqs = super()._compute_inv_freq(base)
        low_freq_wavelen = self.orig_max_position / self.low_freq_factor
        high_freq_wavelen = self.orig_max_position / self.high_freq_factor
        wave_len = 2 * math.pi / inv_freqs
        if self.low_freq_factor != self.high_freq_factor:
            smooth = (self.orig_max_position / wave_len - self.low_freq_factor) / (
                self.high_freq_factor - self.low_freq_factor)
        else:
            smooth = 0
        scaled = inv_freqs / self.scaling_factor
        return torch.where(wave_len < high_freq_wavelen, inv_freqs, torch.where(
            wave_len > low_freq_wavelen, scaled, (1 - smooth) * scaled + smooth * inv_freqs))


class YaRNScalingRotaryEmbedding(RotaryEmbedding):
    def __init__(self, head_size: int, rotary_dim: int, max_position: int, base: float,
                 scaling_factor: float, orig_max_position: int, beta_fast: float = 32,
                 beta_slow: float = 1, attention_factor: float | None = None,
                 truncate: bool = True, **kw) -> None:
        self.scaling_factor = scaling_factor
        self.orig_max_position = orig_max_position
        self.beta_fast, self.beta_slow, self.truncate = beta_fast, beta_slow, truncate
        if attention_factor is None:
            attention_factor = 0.1 * math.log(scaling_factor) + 1.0 if scaling_factor > 1 else 1.0
        self.attention_factor = float(attention_factor)
        super().__init__(head_size, rotary_dim, max_position, base, **kw)

    def _mscale(self) -> float:
        return self.attention_factor

    def _correction_dim(self, num_rotations: float, base: float) -> float:
        return (self.rotary_dim * math.log(self.orig_max_position / (num_rotations * 2 * math.pi))
                / (2 * math.log(base)))

    def _compute_inv_freq(self, base: float) -> torch.Tensor:
        pos_freqs = base ** (torch.arange(0, self.rotary_dim, 2, dtype=torch.float,
                                          device="cpu") / self.rotary_dim)
        low = self._correction_dim(self.beta_fast, base)
        high = self._correction_dim(self.beta_slow, base)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, self.rotary_dim - 1)
        if low == high:
            high += 0.001  # avoid a zero-width ramp
        ramp = (torch.arange(self.rotary_dim // 2, dtype=torch.float, device="cpu") - low) / (
            high - low)
        extrapolation = 1 - ramp.clamp(0, 1)
        return (1.0 / (self.scaling_factor * pos_freqs) * (1 - extrapolation)
                + 1.0 / pos_freqs * extrapolation)


_ROPE_DICT: dict[tuple, RotaryEmbedding] = {}


def get_rope(head_size: int, max_position: int, rope_parameters: dict | None = None
             ) -> RotaryEmbedding:
    """The (shared) rotary embedding for one layer's `rope_parameters` (HF / vLLM names)."""
    p = rope_parameters or {}
    key = (head_size, max_position, tuple(sorted(
        (k, tuple(v) if isinstance(v, list) else v) for k, v in p.items())))
    if key not in _ROPE_DICT:
        _ROPE_DICT[key] = _make_rope(head_size, max_position, p)
    return _ROPE_DICT[key]


def _make_rope(head_size: int, max_position: int, p: dict) -> RotaryEmbedding:
    base = p.get("rope_theta", 10000.0)
    rotary_dim = int(head_size * p.get("partial_rotary_factor", 1.0))
    kw = {"freq_factors": p.get("freq_factors")}
    rope_type = p.get("rope_type", "default")
    if rope_type == "default":
        return RotaryEmbedding(head_size, rotary_dim, max_position, base, **kw)
    if rope_type == "linear":
        return LinearScalingRotaryEmbedding(head_size, rotary_dim, max_position, base,
                                            p["factor"], **kw)
    if rope_type == "llama3":
        return Llama3RotaryEmbedding(
            head_size, rotary_dim, max_position, base, p["factor"], p["low_freq_factor"],
            p["high_freq_factor"], p["original_max_position_embeddings"], **kw)
    if rope_type == "yarn":
        return YaRNScalingRotaryEmbedding(
            head_size, rotary_dim, max_position, base, p["factor"],
            p["original_max_position_embeddings"], p.get("beta_fast") or 32,
            p.get("beta_slow") or 1, p.get("attention_factor"), p.get("truncate", True), **kw)
    raise UnsupportedError(f"rope_type {rope_type!r} is not supported "
                           "(supported: default, linear, llama3, yarn)")
