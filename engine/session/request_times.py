"""RequestTimes: one request's progress across its outputs, measured by the session as
vLLM's RequestStateStats (vllm/v1/metrics/stats.py) names it: arrival_time (Unix s, when
the request was added), first-token latency and end-to-end latency (s from arrival),
output tokens so far per sequence (index, n > 1), plus what the request asked of its
logprobs (top_k, top_ids) so that a front end can shape them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from libvllm.engine.sampling_params import SamplingParams


@dataclass
class RequestTimes:
    """top_k: its sampling params' logprobs (the top entries each token gets); top_ids:
    its logprob_token_ids (the top entries are these, in order)."""

    top_k: int = 0
    top_ids: list[int] | None = None
    num_prompt_tokens: int = 0
    arrival_time: float = field(default_factory=time.time)
    arrival_mono: float = field(default_factory=time.monotonic)
    num_output_tokens: dict[int, int] = field(default_factory=dict)  # index -> tokens so far
    first_token_latency: dict[int, float] = field(default_factory=dict)  # index -> s

    @classmethod
    def for_params(cls, sampling: SamplingParams) -> RequestTimes:
        return cls(top_k=sampling.num_logprobs or 0, top_ids=sampling.logprob_token_ids)

    def observe(self, completion) -> tuple[int, float]:
        """Counts a completion's new tokens: (its tokens so far, its first-token latency)."""
        i = completion.index
        self.num_output_tokens[i] = self.num_output_tokens.get(i, 0) + len(completion.token_ids)
        if completion.token_ids and i not in self.first_token_latency:
            self.first_token_latency[i] = time.monotonic() - self.arrival_mono
        return self.num_output_tokens[i], self.first_token_latency.get(i, 0.0)

    def e2e_latency(self) -> float:
        """Seconds from arrival to now."""
        return time.monotonic() - self.arrival_mono
