"""SchedulerOutput: what one step runs, as vllm/v1/core/sched/output.py, and the
runner's answer ModelRunnerOutput (vllm/v1/outputs.py; the runner extends it with
logprobs).

New requests, and preempted ones resuming (recompute), carry all their token ids
(vLLM's v2 model-runner form); requests already in the runner carry only their new
block ids. finished_req_ids are requests finished since the last step; preempted ones
are listed apart in preempted_req_ids. GrammarOutput is vLLM's grammar-bitmask hand-off
(vllm/v1/core/sched/output.py GrammarOutput): the runner masks those requests' logits
rows before sampling.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from libvllm.engine.sampling_params import SamplingParams


@dataclass
class NewRequestData:
    req_id: str
    token_ids: list[int]  # prompt, plus generated tokens when resumed (recompute)
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int
    prompt_token_ids: list[int] = field(default_factory=list)
    # hybrid models: its state block per GDN group (the block pool's ids)
    state_block_ids: list[int] = field(default_factory=list)
    # hybrid models, prefix caching ("align"): the saved state blocks its hit starts from
    mamba_restore_block_ids: list[int] | None = None


@dataclass
class CachedRequestData:
    req_ids: list[str] = field(default_factory=list)
    new_block_ids: list[list[int]] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)

    @classmethod
    def make_empty(cls) -> CachedRequestData:
        return cls()


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]  # req_id -> tokens this step
    total_num_scheduled_tokens: int
    finished_req_ids: set[str]  # finished since the last step: the runner drops them
    preempted_req_ids: set[str] = field(default_factory=set)
    # async scheduling: a request sampled this step needs, to be sampled, the token of a
    # step still in flight (vLLM's pending_structured_output_tokens, widened to penalties
    # and bad words, which read the output ids so far): that step's output comes first
    pending_output_tokens: bool = False
    # hybrid models, prefix caching ("align"): (req_id, block per GDN group) the runner
    # copies the request's state into after this step (engine/core/mamba_align.py)
    mamba_saves: list[tuple[str, list[int]]] = field(default_factory=list)


@dataclass
class GrammarOutput:
    """The structured-output rows of one step (vllm/v1/core/sched/output.py GrammarOutput):
    the requests sampled under a grammar and their allowed-token bitmask."""

    structured_output_request_ids: list[str]  # one per bitmask row
    grammar_bitmask: torch.Tensor  # int32 [n, ceil(vocab / 32)] on the host; bit set = allowed


@dataclass
class ModelRunnerOutput:
    req_ids: list[str]
    sampled_token_ids: list[list[int]]  # per request; empty for a partial prefill chunk

    @property
    def req_id_to_index(self) -> dict[str, int]:
        return {req_id: i for i, req_id in enumerate(self.req_ids)}
