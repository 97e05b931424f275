"""Logprob gathering, as vllm/v1/sample/ops/logprobs.py and Sampler.gather_logprobs.

Ranks follow vLLM's batched_count_greater_than: the number of vocabulary entries
whose logprob is >= the token's own (1 for the argmax when it is unique).
"""

from __future__ import annotations

import torch

from engine.sample.outputs import LogprobsTensors


def compute_logprobs(logits: torch.Tensor) -> torch.Tensor:
    return logits.log_softmax(dim=-1, dtype=torch.float32)


def batched_count_greater_than(x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    # x: [num_rows, vocab], values: [num_rows, 1] -> [num_rows]
    return (x >= values).sum(-1)


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
