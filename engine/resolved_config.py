"""ResolvedConfig: what the engine runs with, derived once from the user's EngineConfig.

Mirrors vllm/config/vllm.py (VllmConfig: one object of scheduler, cache and compilation
parts, __post_init__ resolving the cudagraph mode and _set_cudagraph_sizes the capture
sizes, try_verify_and_update_config raising a hybrid model's block size), the parts'
fields of vllm/config/scheduler.py (SchedulerConfig, verify_max_model_len's messages),
vllm/config/cache.py (CacheConfig) and vllm/config/compilation.py (CompilationConfig),
the device batch defaults of vllm/engine/arg_utils.py (get_batch_defaults,
_set_default_max_num_seqs_and_batched_tokens_args) and its --mamba-cache-mode deprecation
(create_engine_config), with vllm/model_executor/models/config.py
(MambaModelConfig.verify_and_update_config: a hybrid's mode follows prefix caching).

resolve_config is the one function that derives values; the engine core calls it once at
start-up (engine/engine_core/engine_core.py EngineCore.from_config), once the weights are
in (the model's context length and the device are known). The result is frozen: the
scheduler, KV cache manager, model runner and tensor-parallel workers read it, and it
returns to the front end in EngineCoreReady.config (msgspec encodes these dataclasses).
tests/test_config_frozen.py fails on any write to it outside this module.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from libvllm.engine.compilation_config import (
    CaptureSizes,
    CUDAGraphMode,
    cudagraph_capture_sizes,
    resolve_cudagraph_mode,
)
from libvllm.engine.config import EngineConfig
from libvllm.engine.errors import InvalidArgumentError, UnsupportedError

logger = logging.getLogger(__name__)

# vllm/engine/arg_utils.py _MAMBA_CACHE_MODE_DEPRECATION_MESSAGE, verbatim
MAMBA_CACHE_MODE_DEPRECATION_MESSAGE = (
    "--mamba-cache-mode is deprecated and will be removed in v0.33.0. "
    "It has no effect: Mamba prefix caching follows --enable-prefix-caching.")

# (mamba_cache_mode, max_model_len) -> the attention block size whose page holds a
# hybrid model's state page (engine/worker/mamba_utils.py hybrid_kv_cache_config)
HybridBlockSize = Callable[[str, int], int]


@dataclass(frozen=True)
class DeviceFacts:
    """What resolve_config needs of the device (torch.cuda.get_device_properties)."""

    type: str  # "cpu" | "cuda"
    name: str = "cpu"
    total_memory: int = 0  # bytes; 0 on CPU


@dataclass(frozen=True)
class SchedulerConfig:
    """vllm/config/scheduler.py SchedulerConfig, resolved."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    enable_chunked_prefill: bool = True
    async_scheduling: bool = False
    policy: str = "fcfs"
    long_prefill_token_threshold: int = 0
    long_prefill_token_threshold_adaptive: bool = False
    scheduler_reserve_full_isl: bool = True

    def __post_init__(self) -> None:
        self.verify_max_model_len()

    def verify_max_model_len(self) -> None:
        """vllm/config/scheduler.py::SchedulerConfig.verify_max_model_len."""
        batched, max_model_len = self.max_num_batched_tokens, self.max_model_len
        if batched < max_model_len and not self.enable_chunked_prefill:
            raise InvalidArgumentError(
                f"max_num_batched_tokens ({batched}) is smaller than max_model_len "
                f"({max_model_len}). This effectively limits the maximum sequence length to "
                "max_num_batched_tokens and makes vLLM reject longer sequences. Please "
                "increase max_num_batched_tokens or decrease max_model_len.")
        if batched < self.max_num_seqs:
            raise InvalidArgumentError(
                f"max_num_batched_tokens ({batched}) must be greater than or equal to "
                f"max_num_seqs ({self.max_num_seqs}).")
        if self.long_prefill_token_threshold > max_model_len:
            raise InvalidArgumentError(
                f"long_prefill_token_threshold ({self.long_prefill_token_threshold}) cannot "
                f"be greater than the max_model_len ({max_model_len}).")

    @classmethod
    def from_engine_config(cls, config: EngineConfig, max_model_len: int,
                           max_num_seqs: int, max_num_batched_tokens: int,
                           async_scheduling: bool) -> SchedulerConfig:
        """The scheduler part of config with the derived sizes (resolve_config's)."""
        return cls(max_num_seqs, max_num_batched_tokens, max_model_len,
                   config.enable_chunked_prefill, async_scheduling, config.scheduling_policy,
                   config.long_prefill_token_threshold,
                   config.long_prefill_token_threshold_adaptive,
                   config.scheduler_reserve_full_isl)


@dataclass(frozen=True)
class CacheConfig:
    """vllm/config/cache.py CacheConfig, resolved."""

    block_size: int  # a hybrid GDN model's is raised (its attention page holds a state)
    enable_prefix_caching: bool  # off for a pooling engine
    kv_cache_dtype: str = "auto"
    calculate_kv_scales: bool = False
    kv_cache_memory_bytes: int = 0  # 0: from the device (gpu_memory_utilization, CPU cap)
    gpu_memory_utilization: float = 0.9
    watermark: float = 0.0
    mamba_cache_dtype: str = "auto"
    mamba_ssm_cache_dtype: str = "auto"
    mamba_cache_mode: str = "none"  # none | align (hybrid GDN models)


@dataclass(frozen=True)
class CompilationConfig:
    """vllm/config/compilation.py CompilationConfig, resolved: the mode this engine runs
    (engine/compilation_config.py resolve_cudagraph_mode) and the capture sizes
    (ascending token counts; empty for NONE)."""

    cudagraph_mode: str = "NONE"  # a CUDAGraphMode name
    cudagraph_capture_sizes: tuple[int, ...] = ()

    def capture_sizes(self) -> CaptureSizes:
        """What the model runner's capture_model takes."""
        return CaptureSizes(list(self.cudagraph_capture_sizes),
                            CUDAGraphMode[self.cudagraph_mode])


@dataclass(frozen=True)
class ResolvedConfig:
    """vllm/config/vllm.py VllmConfig: the parts, resolved."""

    scheduler: SchedulerConfig
    cache: CacheConfig
    compilation: CompilationConfig
    device: str  # "cpu" | "cuda"
    runner_type: str = "generate"  # generate | pooling
    tensor_parallel_size: int = 1
    seed: int = 0


def batch_defaults(device_name: str, device_memory: int) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens with chunked prefill): vLLM's
    get_batch_defaults for its LLM class (vllm/engine/arg_utils.py): (1024, 16384) on a
    GPU of at least 70 GiB that is not an A100 (H100, H200), else (256, 8192), the CPU
    too (`vllm serve` takes 8192 tokens on the large GPUs: examples/server passes it).
    Hybrid GDN models get the same: their recurrent state comes out of the KV block pool
    (one state block per running request and group), so the pool, not the seat count,
    limits how many run (docs/hybrid-gdn.md)."""
    if device_memory < 70 << 30 or "a100" in device_name.lower():
        return 256, 8192
    return 1024, 16384


def resolve_config(config: EngineConfig, max_position_embeddings: int, device: DeviceFacts,
                   hybrid_block_size: HybridBlockSize | None = None) -> ResolvedConfig:
    """The one resolve step. hybrid_block_size: given for a hybrid GDN model (vLLM's
    HybridAttentionMambaModelConfig.verify_and_update_config), None otherwise."""
    max_model_len = config.max_model_len or max_position_embeddings
    if max_model_len > max_position_embeddings:
        raise InvalidArgumentError(
            f"max_model_len ({max_model_len}) is greater than the model's context "
            f"length ({max_position_embeddings})")
    seqs, tokens = batch_defaults(device.name, device.total_memory)
    max_num_seqs = config.max_num_seqs or seqs
    max_num_batched_tokens = config.max_num_batched_tokens or (
        tokens if config.enable_chunked_prefill else max(max_model_len, 2048))
    pooling = config.runner_type == "pooling"
    if pooling:  # engine/worker/pooling_runner.py
        _check_pooling(config, hybrid_block_size is not None)
    async_scheduling = not pooling and (device.type == "cuda" if config.async_scheduling
                                        is None else config.async_scheduling)
    scheduler = SchedulerConfig.from_engine_config(
        config, max_model_len, max_num_seqs, max_num_batched_tokens, async_scheduling)
    # no prefix caching for pooling (a cached prefix has no hidden states to pool, vLLM's
    # skip_reading_prefix_cache); a hybrid model's state follows it
    prefix_caching = config.enable_prefix_caching and not pooling
    mamba_cache_mode = _mamba_cache_mode(config, prefix_caching, hybrid_block_size is not None)
    block_size = config.block_size
    if hybrid_block_size is not None:
        block_size = hybrid_block_size(mamba_cache_mode, max_model_len)
    cache = CacheConfig(
        block_size, prefix_caching, config.kv_cache_dtype, config.calculate_kv_scales,
        config.kv_cache_memory_bytes or 0, config.gpu_memory_utilization, config.watermark,
        config.mamba_cache_dtype, config.mamba_ssm_cache_dtype, mamba_cache_mode)
    compilation = _compilation(config, scheduler, hybrid_block_size is not None)
    return ResolvedConfig(scheduler, cache, compilation, device.type,
                          config.runner_type, config.tensor_parallel_size, config.seed)


def _mamba_cache_mode(config: EngineConfig, prefix_caching: bool, hybrid: bool) -> str:
    """vLLM 0.33: the mode follows prefix caching ("align" with it, else "none") for a
    hybrid model (MambaModelConfig.verify_and_update_config) and is "none" for any other
    (CacheConfig's default); a mamba_cache_mode the user sets has no effect, whatever its
    value and the prefix-caching setting: it logs EngineArgs.create_engine_config's
    deprecation warning (EngineConfig rejects a value other than none / align, as vLLM's
    argument parser does)."""
    if config.mamba_cache_mode is not None:
        logger.warning(MAMBA_CACHE_MODE_DEPRECATION_MESSAGE)
    return "align" if hybrid and prefix_caching else "none"


def _compilation(config: EngineConfig, scheduler: SchedulerConfig,
                 hybrid: bool) -> CompilationConfig:
    """vLLM's cudagraph mode (enforce_eager: NONE) and _set_cudagraph_sizes. A hybrid GDN
    model's FULL becomes FULL_AND_PIECEWISE, as vLLM's CompilationConfig resolves a
    UNIFORM_BATCH backend (vllm/config/compilation.py, GDNAttentionBackend): mixed steps
    run as breakable graphs with the GDN core eager (engine/worker/cudagraph_runner.py)."""
    mode = resolve_cudagraph_mode(CUDAGraphMode.parse(config.cudagraph_mode),
                                  config.enforce_eager)
    if hybrid and mode == CUDAGraphMode.FULL:
        logger.warning("CUDAGraphMode.FULL is not supported with GDNAttentionBackend backend "
                       "(support: AttentionCGSupport.UNIFORM_BATCH); setting "
                       "cudagraph_mode=FULL_AND_PIECEWISE")
        mode = CUDAGraphMode.FULL_AND_PIECEWISE
    sizes = cudagraph_capture_sizes(
        scheduler.max_num_seqs, scheduler.max_num_batched_tokens,
        config.cudagraph_capture_sizes, config.max_cudagraph_capture_size)
    return CompilationConfig(mode.name, tuple(sizes) if mode != CUDAGraphMode.NONE else ())


def _check_pooling(config: EngineConfig, hybrid: bool) -> None:
    """What a pooling engine refuses: more than one rank, a hybrid model, async
    scheduling (one step per output)."""
    if config.tensor_parallel_size > 1:
        raise UnsupportedError("--runner pooling runs on one rank (tensor_parallel_size 1)")
    if hybrid:
        raise UnsupportedError("--runner pooling supports attention-only models")
    if config.async_scheduling:
        raise UnsupportedError("--runner pooling does not support --async-scheduling")
