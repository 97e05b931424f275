"""Sampler: logits -> next token ids for the whole batch, on the logits' device.

Mirrors vllm/v1/sample/sampler.py and ops/topk_topp_sampler.py: min_tokens masking,
greedy argmax, temperature, min-p, top-k/top-p by one sort, then sampling with
exponential noise (argmax(p / q), q ~ Exp(1)) so there is no host sync; seeded rows
draw their noise from their own torch.Generator.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.sample.metadata import SamplingMetadata

_SAMPLING_EPS = 1e-5


class Sampler(nn.Module):
    def forward(self, logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        # logits: [num_reqs, vocab] fp32 -> [num_reqs] int64
        logits = apply_min_tokens(logits, md.min_tokens_blocked)
        greedy = logits.argmax(dim=-1)
        if md.all_greedy:
            return greedy
        logits = logits / md.temperature.unsqueeze(1)
        if md.min_p is not None:
            logits = apply_min_p(logits, md.min_p)
        logits = apply_top_k_top_p(logits, md.top_k, md.top_p)
        probs = logits.softmax(dim=-1, dtype=torch.float32)
        sampled = random_sample(probs, md.generators)
        if md.all_random:
            return sampled
        return torch.where(md.temperature < _SAMPLING_EPS, greedy, sampled)


def apply_min_tokens(logits: torch.Tensor, blocked: dict[int, set[int]]) -> torch.Tensor:
    if not blocked:
        return logits
    rows = [r for r, ids in blocked.items() for _ in ids]
    cols = [t for ids in blocked.values() for t in ids]
    logits = logits.clone()
    logits[rows, cols] = -float("inf")
    return logits


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    probs = logits.softmax(dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
    return logits.masked_fill(probs < threshold, -float("inf"))


def apply_top_k_top_p(logits: torch.Tensor, k: torch.Tensor | None,
                      p: torch.Tensor | None) -> torch.Tensor:
    if k is None and p is None:
        return logits
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    if k is not None:
        kth = logits_sort.gather(1, (logits_sort.size(1) - k).unsqueeze(1))  # [num_reqs, 1]
        logits_sort.masked_fill_(logits_sort < kth, -float("inf"))
    if p is not None:
        cum = logits_sort.softmax(dim=-1).cumsum(dim=-1)
        mask = cum <= 1 - p.unsqueeze(1)
        mask[:, -1] = False  # keep at least one token
        logits_sort.masked_fill_(mask, -float("inf"))
    return torch.empty_like(logits).scatter_(1, logits_idx, logits_sort)


def random_sample(probs: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    q = torch.empty_like(probs)
    if len(generators) != probs.shape[0]:
        q.exponential_()
    for row, gen in generators.items():
        q[row].exponential_(generator=gen)
    return probs.div_(q).argmax(dim=-1)
