"""Pooling of a prompt's hidden states, as vllm/model_executor/layers/pooler/ (seq
poolers CLS / LAST / MEAN, the token pooler ALL) and the embedding activation of
vllm/model_executor/layers/pooler/activations.py: `dimensions` truncation first, then L2
normalization (use_activation), so a matryoshka vector is re-normalized.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def pool_hidden_states(hidden: torch.Tensor, pooling_type: str) -> torch.Tensor:
    """hidden: [num_prompt_tokens, hidden_size] -> [hidden_size] (CLS: first token,
    LAST: last, MEAN: mean over the prompt) or [num_prompt_tokens, hidden_size] (ALL)."""
    if pooling_type == "CLS":
        return hidden[0]
    if pooling_type == "LAST":
        return hidden[-1]
    if pooling_type == "MEAN":
        return hidden.float().mean(dim=0)
    if pooling_type == "ALL":
        return hidden
    raise ValueError(f"unknown pooling type {pooling_type!r}")


def embed_activation(pooled: torch.Tensor, dimensions: int | None,
                     use_activation: bool) -> torch.Tensor:
    """pooled: [..., hidden_size] -> [..., dimensions or hidden_size] float32."""
    out = pooled.float()
    if dimensions is not None:
        out = out[..., :dimensions]
    if use_activation:
        out = F.normalize(out, p=2, dim=-1)
    return out
