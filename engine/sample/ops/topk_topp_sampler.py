"""Top-k / top-p masking and random sampling, as vllm/v1/sample/ops/topk_topp_sampler.py
(the PyTorch-native path): one ascending sort serves both masks; sampling draws
exponential noise and takes argmax(p / q), q ~ Exp(1), so there is no host sync.
Seeded rows draw their noise from their own torch.Generator. Ours: the argmax is taken
as argmax(logits - log q), the same token without the softmax (p is exp(logits) over a
constant), whose one-block-per-row reduction costs 33 us over a 128k vocab on an H200.
On CUDA the log, the subtraction and the argmax run in kernels/sampling.py's two-launch
row argmax (many programs a row), which also serves argmax_rows (greedy rows; torch's
argmax: 27 us); the noise is still drawn by torch. Its log is libdevice's logf, the twin
of the logf torch.log runs on CUDA; should the two differ in an ulp, a near-tie may pick
the other token, as fair a sample. The kernel leaves the logits as they were (the torch path
subtracts in place; no caller reads them after sampling). CPU: the torch path.
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
    # logits: [num_reqs, vocab] fp32, temperature applied -> [num_reqs] int64; the torch
    # path overwrites logits
    q = torch.empty_like(logits)  # [num_reqs, vocab] Exp(1) noise
    if len(generators) != logits.shape[0]:
        q.exponential_()
    for row, gen in generators.items():
        q[row].exponential_(generator=gen)
    if logits.dtype == torch.float32 and _use_sampling_kernel(logits):
        from libvllm.kernels.sampling import argmax_rows as argmax_kernel  # lazy: CUDA path only

        return argmax_kernel(logits, q)
    return argmax_rows(logits.sub_(q.log_()))


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """x.argmax(-1) of [rows, vocab] -> [rows] int64 (the first maximum, NaN maximal); on
    CUDA kernels/sampling.py's argmax: many programs per row, not one thread block."""
    if _use_sampling_kernel(x):
        from libvllm.kernels.sampling import argmax_rows as argmax_kernel  # lazy: CUDA path only

        return argmax_kernel(x)
    return x.argmax(dim=-1)


def _use_sampling_kernel(x: torch.Tensor) -> bool:
    """Whether kernels/sampling.py takes this argmax: float [rows, vocab] on CUDA, its last
    dimension contiguous, vocab > 0."""
    return (x.is_cuda and x.dim() == 2 and x.shape[1] > 0 and x.stride(1) == 1
            and x.dtype in (torch.float32, torch.bfloat16, torch.float16))


def warm_up_sampling_kernels(logits: torch.Tensor) -> None:
    """Compile the CUDA argmax's variants at start-up (the profile run calls this; vLLM's
    _dummy_sampler_run also samples before serving): greedy and random, at one row and at
    all of `logits`' rows (the merge's two lane counts), so no step of the first requests
    waits for Triton's JIT. Nothing off CUDA."""
    # logits: [max_num_reqs, vocab]
    if not _use_sampling_kernel(logits):
        return
    for rows in sorted({1, logits.shape[0]}):
        x = logits[:rows].float()  # [rows, vocab], as the sampler's logits
        argmax_rows(x)
        random_sample(x, {})
