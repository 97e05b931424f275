"""Top-k / top-p masking and random sampling, as vllm/v1/sample/ops/topk_topp_sampler.py
(the PyTorch-native path): one ascending sort serves both masks; sampling draws
exponential noise and takes argmax(p / q), q ~ Exp(1), so there is no host sync.
Seeded rows draw their noise from their own torch.Generator.
"""

from __future__ import annotations

import torch


def apply_top_k_top_p(logits: torch.Tensor, k: torch.Tensor | None,
                      p: torch.Tensor | None) -> torch.Tensor:
    # logits: [num_reqs, vocab]; k: [num_reqs] (vocab = off); p: [num_reqs] (1.0 = off)
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
    # probs: [num_reqs, vocab] (overwritten) -> [num_reqs] int64
    q = torch.empty_like(probs)
    if len(generators) != probs.shape[0]:
        q.exponential_()
    for row, gen in generators.items():
        q[row].exponential_(generator=gen)
    return probs.div_(q).argmax(dim=-1)
