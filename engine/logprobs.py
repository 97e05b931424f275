"""Logprobs as the user sees them.

Mirrors vllm/logprobs.py (Logprob, SampleLogprobs, PromptLogprobs,
append_logprobs_for_next_position): each position is a dict token id ->
Logprob(logprob, rank, decoded_token), the sampled (or actual prompt) token first, then
the top-k with ranks 1..k; the first prompt position is None. The per-request assembly
is engine/logprobs_processor.py.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


LogprobsOnePosition = dict[int, Logprob]
SampleLogprobs = list[LogprobsOnePosition]
PromptLogprobs = list[LogprobsOnePosition | None]


def append_logprobs_for_next_position(request_logprobs: list, token_ids: list[int],
                                      logprobs: list[float],
                                      decoded_tokens: Iterable[str | None], rank: int,
                                      num_logprobs: int) -> None:
    """Column 0 is the chosen token with its rank; the top-k follow with ranks 1..k
    (a chosen token that is also in the top-k lands once, under its top-k entry)."""
    if num_logprobs == -1:
        num_logprobs = len(logprobs)
    ranks = itertools.chain((rank,), range(1, num_logprobs + 1))
    request_logprobs.append({
        tok: Logprob(lp, r, text)
        for tok, lp, r, text in zip(token_ids, logprobs, ranks, decoded_tokens)})
