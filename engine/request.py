"""Request and RequestStatus: the scheduler's view of one generation, as vllm/v1/request.py.

Token ids live here (prompt + generated); full blocks are hashed incrementally for
prefix caching (vLLM's request.block_hashes filled by its block hasher).
"""

from __future__ import annotations

import enum

from engine.core.kv_cache_utils import BlockHash, hash_block_tokens
from engine.sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    # anything after PREEMPTED is finished
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()

    @staticmethod
    def is_finished(status: RequestStatus) -> bool:
        return status > RequestStatus.PREEMPTED

    @staticmethod
    def get_finished_reason(status: RequestStatus) -> str | None:
        return _FINISHED_REASON_MAP.get(status)


_FINISHED_REASON_MAP = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}


class Request:
    def __init__(self, request_id: str, prompt_token_ids: list[int],
                 sampling_params: SamplingParams, eos_token_id: int | None,
                 arrival_time: float, block_size: int, priority: int = 0) -> None:
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self.sampling_params = sampling_params
        self.eos_token_id = eos_token_id
        self.arrival_time = arrival_time
        self.priority = priority
        self.max_tokens = sampling_params.max_tokens
        self.status = RequestStatus.WAITING
        self.stop_reason: int | str | None = None
        self.output_token_ids: list[int] = []
        self.all_token_ids: list[int] = list(self.prompt_token_ids)
        self.num_computed_tokens = 0
        self.num_cached_tokens = -1  # prefix-cache hit length, set when first scheduled
        self.num_preemptions = 0
        self.block_size = block_size
        self.block_hashes: list[BlockHash] = []
        self._update_block_hashes()

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def append_output_token_ids(self, token_ids: list[int]) -> None:
        self.output_token_ids.extend(token_ids)
        self.all_token_ids.extend(token_ids)
        self._update_block_hashes()

    def _update_block_hashes(self) -> None:
        bs = self.block_size
        while (len(self.block_hashes) + 1) * bs <= self.num_tokens:
            i = len(self.block_hashes)
            parent = self.block_hashes[-1] if i else None
            self.block_hashes.append(
                hash_block_tokens(parent, self.all_token_ids[i * bs:(i + 1) * bs]))

    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)

    def get_finished_reason(self) -> str | None:
        return RequestStatus.get_finished_reason(self.status)
