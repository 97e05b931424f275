"""What crosses the front end / engine core boundary, as vllm/v1/engine/__init__.py
(EngineCoreRequest, EngineCoreOutput, EngineCoreOutputs, UtilityOutput,
EngineCoreRequestType).

msgspec structs (array_like: encoded as msgpack arrays, no field names on the wire). The
same objects pass by reference with the in-process client. `error` of an output is
(vllm.h status, message) of a request the core failed alone (its grammar did not
compile); the front end rebuilds the exception with engine.errors.error_from_wire.
"""

from __future__ import annotations

import enum

import msgspec

from libvllm.engine.errors import (
    InvalidArgumentError,
    ModelLoadError,
    OutOfResourcesError,
    UnsupportedError,
    VllmError,
)
from libvllm.engine.metrics import SchedulerStats
from libvllm.engine.pooling_params import PoolingParams
from libvllm.engine.resolved_config import ResolvedConfig
from libvllm.engine.sample.outputs import LogprobsLists
from libvllm.engine.sampling_params import SamplingParams


class EngineCoreRequestType(enum.Enum):
    """The first frame of every message on the input socket (vLLM's request types)."""

    ADD = b"\x00"
    ABORT = b"\x01"
    UTILITY = b"\x03"
    SHUTDOWN = b"\x04"


class EngineCoreRequest(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams  # completed by the front end (serial_utils encodes it)
    arrival_time: float
    priority: int = 0
    cache_salt: str | None = None
    reasoning_parser_kwargs: dict | None = None
    # a pooling request (engine/pooling_params.py): prefill only, its output is pooled
    pooling_params: PoolingParams | None = None


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """What one step produced for one request."""

    request_id: str
    new_token_ids: list[int]
    new_logprobs: LogprobsLists | None = None  # one row per new token
    new_prompt_logprobs: LogprobsLists | None = None  # all prompt positions but the first
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error" | "repetition"
    stop_reason: int | str | None = None
    num_cached_tokens: int = -1  # prefix-cache hit length; -1: not scheduled yet
    error: tuple[int, str] | None = None  # (vllm.h status, message) with "error"
    pooling_output: list | None = None  # a pooling request's vector(s), when finished

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class UtilityOutput(msgspec.Struct, array_like=True, gc=False):
    """The answer to a utility call: its result as raw msgpack, or why it failed."""

    call_id: int
    failure: str | None = None
    result: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"\xc0"))  # nil


class EngineCoreOutputs(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    outputs: list[EngineCoreOutput] = []
    scheduler_stats: SchedulerStats | None = None
    num_preemptions: int = 0  # the scheduler's total
    utility_output: UtilityOutput | None = None
    # a child's log record (level, logger name, message), re-emitted by the front end
    log_record: tuple[int, str, str] | None = None


class EngineCoreReady(msgspec.Struct, array_like=True, gc=False):
    """What the front end learns from the core at start-up (vLLM's handshake): the
    resolved config (engine/resolved_config.py) and the model's facts."""

    architecture: str
    name: str
    vocab_size: int
    num_gpu_blocks: int
    config: ResolvedConfig  # the engine core's one resolve step: sizes, modes, device
    cudagraph_capture_time_s: float
    default_sampling_params: dict  # the model's generation_config.json defaults
    memory_profile: dict  # bytes, gpu_worker's profile run and the graph pool (CUDA)
    dtype: str  # "bfloat16" | "float16" | "float32", as the core resolved config.dtype
    # generation_config.json's eos_token_id (or a GGUF's end-of-generation ids) as a list:
    # only these cross, the file's other keys being arbitrary JSON msgpack may not encode
    eos_token_ids: list[int]
    hidden_size: int = 0  # the pooled vector's size (vLLM ModelConfig.embedding_size)
    is_matryoshka: bool = False  # pooling requests may ask for fewer `dimensions`
    matryoshka_dimensions: list[int] | None = None  # the sizes allowed; None: any
    # vllm_model_info n_params / n_layers as the loader counted them in the checkpoint's
    # tensor index (ModelArchConfig.checkpoint_*); -1: unknown (dummy load)
    n_params: int = -1
    n_layers: int = -1
    # a GGUF's key/values as the loader read them (None: a Hugging Face directory); the
    # front end builds its tokenizer and vllm_model_meta_* from them, never re-opening the
    # file. Every value is a str/int/float/bool or a list of them (msgpack-encodable), the
    # reader caps the array elements; cost: examples/bench/ready_metadata.py
    gguf_metadata: dict | None = None

    @property
    def max_model_len(self) -> int:
        return self.config.scheduler.max_model_len

    @property
    def device(self) -> str:
        """"cuda" | "cpu", as the core resolved EngineConfig.device."""
        return self.config.device


class EngineCoreStartupFailure(msgspec.Struct, array_like=True, gc=False):
    """Why the child could not start (e.g. ModelLoadError): vllm.h status and message."""

    status: int
    message: str


def error_from_wire(error: tuple[int, str]) -> VllmError:
    """The exception of a status and message that crossed the socket."""
    status, message = error
    exc = _ERRORS_BY_STATUS.get(status, VllmError)(message)
    exc.status = status
    return exc


_ERRORS_BY_STATUS = {e.status: e for e in (
    InvalidArgumentError, ModelLoadError, UnsupportedError, OutOfResourcesError)}
