"""SchedulerOutput: what one step runs, as vllm/v1/core/sched/output.py.

New (or resumed-after-preemption) requests carry all their token ids; requests
already in the runner carry only their new block ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.sampling_params import SamplingParams


@dataclass
class NewRequestData:
    req_id: str
    token_ids: list[int]  # prompt, plus generated tokens when resumed (recompute)
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int


@dataclass
class CachedRequestData:
    req_ids: list[str] = field(default_factory=list)
    new_block_ids: list[list[int]] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]  # req_id -> tokens this step
    total_num_scheduled_tokens: int
    finished_req_ids: set[str]  # finished or preempted since the last step: runner drops them
    preempted_req_ids: set[str] = field(default_factory=set)


@dataclass
class ModelRunnerOutput:
    req_ids: list[str]
    sampled_token_ids: list[list[int]]  # per request; empty for a partial prefill chunk
