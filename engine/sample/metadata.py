"""SamplingMetadata: per-step sampling tensors for the batch, as vllm/v1/sample/metadata.py."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SamplingMetadata:
    temperature: torch.Tensor | None  # [num_reqs] fp32; None when all greedy
    all_greedy: bool
    all_random: bool
    top_p: torch.Tensor | None  # [num_reqs] fp32; None when no request uses it
    top_k: torch.Tensor | None  # [num_reqs] int64 (vocab size = off); None when unused
    min_p: torch.Tensor | None  # [num_reqs] fp32; None when unused
    generators: dict[int, torch.Generator]  # batch row -> per-request seeded generator
    # rows still under min_tokens: the stop token ids they must not sample
    min_tokens_blocked: dict[int, set[int]]
