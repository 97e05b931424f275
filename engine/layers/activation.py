"""SiluAndMul, as vllm/model_executor/layers/activation.py: silu(x[:d]) * x[d:]."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [num_tokens, 2 * d] -> [num_tokens, d]
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]
