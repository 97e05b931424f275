"""Logprob gathering, as vllm/v1/sample/ops/logprobs.py and Sampler.gather_logprobs.

Ranks follow vLLM's batched_count_greater_than: the number of vocabulary entries
whose logprob is >= the token's own (1 for the argmax when it is unique).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from libvllm.engine.sample.outputs import LogprobsTensors


def compute_logprobs(logits: torch.Tensor) -> torch.Tensor:
    return logits.log_softmax(dim=-1, dtype=torch.float32)


def batched_count_greater_than(x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    # x: [num_rows, vocab], values: [num_rows, 1] -> [num_rows]
    return (x >= values).sum(-1)


def gather_logprobs_with_ids(logprobs: torch.Tensor, num_logprobs: int | None,
                             token_ids: torch.Tensor, ids: torch.Tensor) -> LogprobsTensors:
    """gather_logprobs where rows with ids ([num_rows, W] int64, -1-padded; a row of -1
    has none) take the logprobs of those ids after the sampled token instead of the top-k
    (vLLM's gather_specific_token_logprobs); columns past a row's own count are padding
    that the output side never reads."""
    k = num_logprobs or 0
    base = gather_logprobs(logprobs, k, token_ids)  # [num_rows, 1 + k]
    width = max(k, ids.shape[1])
    top_ids = F.pad(base.logprob_token_ids[:, 1:], (0, width - k))  # [num_rows, width]
    top_lps = F.pad(base.logprobs[:, 1:], (0, width - k), value=float("-inf"))
    rows = ids[:, :1] >= 0  # [num_rows, 1]: the row has ids
    ids = ids.clamp(min=0)
    own_ids = F.pad(ids, (0, width - ids.shape[1]))
    own_lps = F.pad(logprobs.gather(-1, ids), (0, width - ids.shape[1]), value=float("-inf"))
    return LogprobsTensors(
        torch.cat((base.logprob_token_ids[:, :1], torch.where(rows, own_ids, top_ids)), 1),
        torch.cat((base.logprobs[:, :1], torch.where(rows, own_lps, top_lps)), 1),
        base.selected_token_ranks)


def gather_logprobs(logprobs: torch.Tensor, num_logprobs: int,
                    token_ids: torch.Tensor) -> LogprobsTensors:
    """logprobs [num_rows, vocab], token_ids [num_rows] int64 -> rows of
    (token, top-1 .. top-num_logprobs) ids and logprobs, plus the token's rank."""
    topk_logprobs, topk_indices = torch.topk(logprobs, num_logprobs, dim=-1)
    token_ids = token_ids.unsqueeze(-1)  # [num_rows, 1]
    token_logprobs = logprobs.gather(-1, token_ids)
    ranks = batched_count_greater_than(logprobs, token_logprobs)
    return LogprobsTensors(torch.cat((token_ids, topk_indices), dim=1),
                           torch.cat((token_logprobs, topk_logprobs), dim=1), ranks)
