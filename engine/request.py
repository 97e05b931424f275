"""Request and RequestStatus: the scheduler's view of one generation, as vllm/v1/request.py.

A request with structured outputs starts WAITING_FOR_FSM (its grammar compiles off the
loop) and carries its StructuredOutputRequest; a request the engine has to fail alone
(a grammar that did not compile, a token the grammar rejected) ends FINISHED_ERROR with
its `error`, finish reason "error".

Token ids live here (prompt + generated); full blocks are hashed incrementally for
prefix caching (vLLM's request.block_hashes filled by its block hasher). Requests order
by (priority, arrival_time, request_id) for the priority policy: lower values first.
"""

from __future__ import annotations

import enum

from libvllm.engine.core.kv_cache_utils import BlockHash, get_request_block_hasher
from libvllm.engine.errors import InvalidArgumentError, VllmError
from libvllm.engine.sampling_params import SamplingParams
from libvllm.engine.structured_output.request import StructuredOutputRequest

_CACHE_SALT_FORBIDDEN_CHARS = frozenset("@/\\\x00")
_MAX_CACHE_SALT_LENGTH = 128


def validate_cache_salt(cache_salt: object) -> None:
    """vllm/entrypoints/generate/base/protocol.py::validate_cache_salt."""
    if cache_salt is None:
        return
    if not isinstance(cache_salt, str) or not cache_salt:
        raise InvalidArgumentError(
            "Parameter 'cache_salt' must be a non-empty string if provided.")
    if len(cache_salt) > _MAX_CACHE_SALT_LENGTH or \
            any(c in _CACHE_SALT_FORBIDDEN_CHARS for c in cache_salt):
        raise InvalidArgumentError(
            "Parameter 'cache_salt' must be at most 128 characters and must not contain "
            "'@', '/', '\\\\', or NUL.")


class RequestStatus(enum.IntEnum):
    WAITING = enum.auto()
    WAITING_FOR_FSM = enum.auto()  # its structured-output grammar is still compiling
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    # anything after PREEMPTED is finished
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_ERROR = enum.auto()
    FINISHED_REPETITION = enum.auto()  # repetition_detection fired

    def __str__(self) -> str:
        return self.name

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
    RequestStatus.FINISHED_ERROR: "error",
    RequestStatus.FINISHED_REPETITION: "repetition",
}


class Request:
    def __init__(self, request_id: str, prompt_token_ids: list[int],
                 sampling_params: SamplingParams, eos_token_id: int | None,
                 arrival_time: float, block_size: int, priority: int = 0,
                 cache_salt: str | None = None,
                 structured_output_request: StructuredOutputRequest | None = None) -> None:
        validate_cache_salt(cache_salt)
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self.sampling_params = sampling_params
        self.eos_token_id = eos_token_id
        self.arrival_time = arrival_time
        self.priority = priority
        self.cache_salt = cache_salt
        assert sampling_params.max_tokens is not None  # the engine fills it in
        self.max_tokens = sampling_params.max_tokens
        self.structured_output_request = structured_output_request
        self.use_structured_output = structured_output_request is not None
        self.status = RequestStatus.WAITING_FOR_FSM if self.use_structured_output \
            else RequestStatus.WAITING
        self.error: VllmError | None = None  # why it ended FINISHED_ERROR
        self.stop_reason: int | str | None = None
        self.output_token_ids: list[int] = []
        self.all_token_ids: list[int] = list(self.prompt_token_ids)
        self.num_computed_tokens = 0
        self.num_cached_tokens = -1  # prefix-cache hit length, set when first scheduled
        self.num_preemptions = 0
        # async scheduling: tokens sampled by steps still in flight (not yet appended)
        self.num_output_placeholders = 0
        self.is_prefill_chunk = False  # the last scheduled step samples nothing
        # prompt logprobs need every prompt position computed (vLLM sampling_params.py)
        self.skip_reading_prefix_cache = bool(sampling_params.skip_reading_prefix_cache)
        self.block_size = block_size
        self.block_hashes: list[BlockHash] = []
        self._block_hasher = get_request_block_hasher(block_size)
        self.update_block_hashes()

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def append_output_token_ids(self, token_ids: int | list[int]) -> None:
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        self.output_token_ids.extend(token_ids)
        self.all_token_ids.extend(token_ids)
        self.update_block_hashes()

    def update_block_hashes(self) -> None:
        """Hash any new full blocks."""
        self.block_hashes.extend(self._block_hasher(self))

    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)

    def get_finished_reason(self) -> str | None:
        return RequestStatus.get_finished_reason(self.status)

    def __lt__(self, other: Request) -> bool:
        """Priority-queue order: priority, then arrival time, then request id."""
        if self.priority != other.priority:
            return self.priority < other.priority
        if self.arrival_time != other.arrival_time:
            return self.arrival_time < other.arrival_time
        if self.request_id != other.request_id:
            return self.request_id < other.request_id
        return id(self) < id(other)
