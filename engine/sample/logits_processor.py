"""The built-in logits processors, as vllm/v1/sample/logits_processor/builtin.py:
min_tokens and logit_bias (they can change the argmax, so they run for every row)
and min_p (argmax-invariant, applied after temperature on sampled rows only).

Each gathers its (row, token) pairs from the step's SamplingMetadata into one index
tensor and writes them with a single indexed op on the logits' device.
"""

from __future__ import annotations

import torch

from libvllm.engine.sample.ops.torch_utils import async_tensor_h2d


def apply_min_tokens(logits: torch.Tensor, min_tokens: dict[int, set[int]]) -> torch.Tensor:
    # min_tokens: row -> stop token ids it may not sample yet
    if not min_tokens:
        return logits
    rows = [r for r, ids in min_tokens.items() for _ in ids]
    cols = [t for ids in min_tokens.values() for t in ids]
    index = async_tensor_h2d([rows, cols], torch.long, logits.device)
    # a device scalar: a Python one would be copied from pageable memory (a host sync)
    logits.index_put_((index[0], index[1]), logits.new_full((), -float("inf")))
    return logits


def apply_logit_bias(logits: torch.Tensor, logit_bias: dict[int, dict[int, float]]) -> torch.Tensor:
    # logit_bias: row -> {token id: bias}
    if not logit_bias:
        return logits
    rows = [r for r, lb in logit_bias.items() for _ in lb]
    cols = [t for lb in logit_bias.values() for t in lb]
    biases = [b for lb in logit_bias.values() for b in lb.values()]
    index = async_tensor_h2d([rows, cols], torch.long, logits.device)
    logits[index[0], index[1]] += async_tensor_h2d(biases, logits.dtype, logits.device)
    return logits


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    # min_p: [num_reqs]; tokens below min_p * max prob are dropped
    probs = logits.softmax(dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
    return logits.masked_fill_(probs < threshold, -float("inf"))
