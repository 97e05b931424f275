"""capi.typed_outputs: the per-sequence parts of vllm_request_output and vllm_event
(since ABI 1.0): the sequence index (n > 1), typed logprobs and per-request timings.

Logprobs come from CompletionOutput.logprobs (vllm/logprobs.py: per generated token a
dict token id -> Logprob(logprob, rank), the sampled token and the top-k with ranks
1..k) as vllm_token_logprobs: the sampled token's logprob and rank, then the top k by
rank, or with logprob_token_ids those ids in their order (rank = position). Timings are
measured by the front end as vLLM's RequestStateStats / FinishedRequestStats name them:
arrival_time (Unix s, when the request was added), first_token_latency and e2e_latency
(s from arrival).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from _libvllm import ffi


@dataclass
class RequestTimes:
    """One request's progress across outputs: tokens and first-token time per sequence;
    top_k: its sampling params' logprobs (the top entries each token gets); top_ids: its
    logprob_token_ids (the top entries are these, in order)."""

    top_k: int = 0
    top_ids: list[int] | None = None
    num_prompt_tokens: int = 0
    arrival_time: float = field(default_factory=time.time)
    arrival_mono: float = field(default_factory=time.monotonic)
    num_output_tokens: dict[int, int] = field(default_factory=dict)  # index -> tokens so far
    first_token_latency: dict[int, float] = field(default_factory=dict)  # index -> s

    @classmethod
    def for_params(cls, sampling) -> RequestTimes:
        return cls(top_k=sampling.num_logprobs or 0, top_ids=sampling.logprob_token_ids)

    def observe(self, completion) -> tuple[int, float]:
        """Counts a completion's new tokens: (its tokens so far, its first-token latency)."""
        i = completion.index
        self.num_output_tokens[i] = self.num_output_tokens.get(i, 0) + len(completion.token_ids)
        if completion.token_ids and i not in self.first_token_latency:
            self.first_token_latency[i] = time.monotonic() - self.arrival_mono
        return self.num_output_tokens[i], self.first_token_latency.get(i, 0.0)


def fill(out, completion, first_token_latency: float, times: RequestTimes, finished: bool,
         memory: list) -> None:
    """Sets index, logprobs and timings of a vllm_request_output / vllm_event."""
    out.index = completion.index
    out.arrival_time = times.arrival_time
    out.first_token_latency = first_token_latency
    out.e2e_latency = time.monotonic() - times.arrival_mono if finished else 0.0
    out.logprobs = ffi.NULL
    if completion.logprobs is not None and completion.token_ids:
        out.logprobs = _logprobs(completion, times.top_k, times.top_ids, memory)


def _logprobs(completion, top_k: int, top_ids: list[int] | None, memory: list):
    """vllm_token_logprobs[len(token_ids)] of a completion; top_k = the params' logprobs;
    top_ids: logprob_token_ids (their entries, whatever the sampled token's rank)."""
    array = ffi.new("vllm_token_logprobs[]", len(completion.token_ids))
    memory.append(array)
    for entry, token, position in zip(array, completion.token_ids, completion.logprobs):
        sampled = position[token]
        entry.token_id, entry.rank, entry.logprob = token, sampled.rank or 0, sampled.logprob
        if top_ids is not None:
            top = [(i + 1, t, position[t].logprob) for i, t in enumerate(top_ids)]
        else:
            top = sorted(((lp.rank, tid, lp.logprob) for tid, lp in position.items()
                          if lp.rank is not None and lp.rank <= top_k))[:top_k]
        if top:  # keep the owner: reading entry.top back gives a pointer that owns nothing
            owner = ffi.new("vllm_logprob[]", [(tid, rank, lp) for rank, tid, lp in top])
            memory.append(owner)
            entry.top, entry.n_top = owner, len(top)
    return array
