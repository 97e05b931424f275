"""Rotary position embedding (NeoX / rotate-half layout), as
vllm/model_executor/layers/rotary_embedding/base.py (RotaryEmbedding).

GGUF llama weights are stored permuted for ggml's interleaved rope; the loader
un-permutes Q/K so every model here uses the rotate-half form.
"""

from __future__ import annotations

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    def __init__(self, head_size: int, rotary_dim: int, max_position: int, base: float) -> None:
        super().__init__()
        self.head_size = head_size
        self.rotary_dim = rotary_dim
        inv_freq = 1.0 / (
            base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim)
        )  # [rotary_dim / 2]
        t = torch.arange(max_position, dtype=torch.float)
        freqs = torch.outer(t, inv_freq)  # [max_position, rotary_dim / 2]
        self.register_buffer("cos_sin_cache", torch.cat((freqs.cos(), freqs.sin()), dim=-1),
                             persistent=False)  # [max_position, rotary_dim]

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x: [num_tokens, num_heads, head_size]; cos/sin: [num_tokens, 1, rotary_dim / 2]
        rot, rest = x[..., : self.rotary_dim], x[..., self.rotary_dim :]
        x1, x2 = rot.chunk(2, dim=-1)
        xf1, xf2 = x1.float(), x2.float()
        out = torch.cat((xf1 * cos - xf2 * sin, xf2 * cos + xf1 * sin), dim=-1).to(x.dtype)
        return torch.cat((out, rest), dim=-1) if rest.numel() else out

    def forward(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: [num_tokens]; query: [num_tokens, nq * head]; key: [num_tokens, nkv * head]
        cos, sin = self.cos_sin_cache[positions].unsqueeze(1).chunk(2, dim=-1)
        n = positions.shape[0]
        q = self._rotate(query.view(n, -1, self.head_size), cos, sin)
        k = self._rotate(key.view(n, -1, self.head_size), cos, sin)
        return q.reshape(n, -1), k.reshape(n, -1)
