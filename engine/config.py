"""EngineConfig: what the user asked for (vLLM's EngineArgs, flattened), frozen.

Mirrors the names and defaults of vllm/engine/arg_utils.py (EngineArgs) for the fields
that exist so far, with the value checks of vllm/config/scheduler.py, cache.py and
compilation.py. A None default (or vllm.h's 0 for the int fields) means "unset": the one
resolve step, engine/resolved_config.py resolve_config, derives the value from the model
and the device at engine-core start-up, and everything below reads the ResolvedConfig it
returns. Nothing writes an EngineConfig after construction (tests/test_config_frozen.py
scans the tree for writes); its defaults are the only defaults (vllm.h's
vllm_engine_params_init writes the same values, checked by that test).
"""

from __future__ import annotations

from dataclasses import dataclass

from libvllm.engine.compilation_config import CUDAGraphMode
from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.pooler_config import (
    PoolerConfig,
    check_runner_convert,
    resolve_pooler_config,
    resolve_runner_type,
)

# vLLM's names for what this engine implements (the full lists: vllm/config/cache.py
# CacheDType, MambaDType; vllm/model_executor/layers/quantization QUANTIZATION_METHODS)
SUPPORTED_QUANTIZATION = (None, "fp8", "compressed-tensors")
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")
MAMBA_DTYPES = ("auto", "float32", "float16", "bfloat16")


@dataclass(frozen=True)
class EngineConfig:
    model: str
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    max_model_len: int | None = None  # None / 0: the model's context length
    max_num_seqs: int | None = None  # None / 0: vLLM's default for the device
    max_num_batched_tokens: int | None = None  # None / 0: the device's, with chunked prefill
    block_size: int = 16
    # None / 0: derived from device memory; else the KV cache's bytes (overrides the fraction)
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float = 0.9  # fraction of the GPU this engine may use (vLLM)
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    seed: int = 0
    enforce_eager: bool = False  # True: no CUDA graphs
    # torch's intra-op CPU threads (torch.set_num_threads); 0: torch's own (with CUDA: 1
    # once the model is loaded unless OMP_NUM_THREADS is set, engine/worker/torch_threads.py)
    n_threads: int = 0
    # vLLM -cc.cudagraph_mode: NONE | PIECEWISE | FULL | FULL_DECODE_ONLY |
    # FULL_AND_PIECEWISE (a piecewise part is captured as a full graph here:
    # engine/compilation_config.py). None: vLLM's default FULL_AND_PIECEWISE,
    # decode graphs on the decode kernel + mixed graphs of every step up to the largest
    # capture size (start-up and throughput against FULL: docs/BENCHMARKS.md)
    cudagraph_mode: str | None = None
    # overlap scheduling step N+1 with running step N (vLLM --async-scheduling);
    # None: on with CUDA, off on CPU (whose forward pass blocks: nothing to overlap)
    async_scheduling: bool | None = None
    # the engine core (scheduler + model runner) in a child process (vLLM's
    # VLLM_ENABLE_V1_MULTIPROCESSING); None: that env var, else on with CUDA, off on CPU
    multiprocessing: bool | None = None
    cudagraph_capture_sizes: list[int] | None = None  # None: vLLM's ladder (below)
    max_cudagraph_capture_size: int | None = None  # None: min(2 * max_num_seqs, 1024)
    # vLLM --tensor-parallel-size: ranks the weights are sharded over, one process each
    # (engine/executor/multiproc_executor.py; docs/tensor_parallel.md)
    tensor_parallel_size: int = 1
    # vLLM --distributed-executor-backend: None / "mp" (worker processes on this host) |
    # "external_launcher" (every rank started by torchrun or the like: multi-node)
    distributed_executor_backend: str | None = None
    load_format: str = "auto"  # auto: the checkpoint's weights | dummy: random, config only
    skip_tokenizer_init: bool = False  # no tokenizer: token-id prompts, token-id outputs
    max_logprobs: int = 20  # vLLM --max-logprobs; -1: the whole vocab
    served_model_name: str | None = None
    tokenizer: str | None = None  # vLLM --tokenizer: a Hugging Face tokenizer directory
    # scheduler (vllm/config/scheduler.py SchedulerConfig, EngineArgs names)
    scheduling_policy: str = "fcfs"  # fcfs | priority (lower value first, then arrival)
    long_prefill_token_threshold: int = 0  # cap on a prefill chunk when others wait; 0: off
    long_prefill_token_threshold_adaptive: bool = False  # floor the cap at a fair share
    scheduler_reserve_full_isl: bool = True  # admit only if the whole prompt fits the KV
    watermark: float = 0.0  # fraction of KV blocks kept free when admitting requests
    # structured outputs, reasoning, tool calling (vLLM --structured-outputs-config.backend,
    # --reasoning-parser, --enable-auto-tool-choice, --tool-call-parser)
    structured_outputs_backend: str = "auto"  # auto | xgrammar | guidance
    reasoning_parser: str = ""  # "": none; deepseek_r1 | qwen3
    # vLLM's --reasoning-config: the strings that open / forcibly end a reasoning block
    # (thinking_token_budget); "": the reasoning parser's markers
    reasoning_start_str: str = ""
    reasoning_end_str: str = ""
    enable_auto_tool_choice: bool = False  # tool_choice "auto" (needs tool_call_parser)
    tool_call_parser: str = ""  # "": none; hermes | llama3_json | mistral | pythonic | ...
    # vLLM's --tool-strict-level (auto | function | parameter); None: the parser's default
    tool_strict_level: str | None = None
    # quantization (vllm/config/model.py `quantization`, vllm/config/cache.py CacheConfig)
    # vLLM --quantization: None reads the checkpoint's quantization_config; "fp8" on an
    # unquantized checkpoint quantizes its linear weights at load (online dynamic FP8)
    quantization: str | None = None
    # vLLM --kv-cache-dtype: auto (the model dtype) | fp8 | fp8_e4m3 (fp8 means e4m3)
    kv_cache_dtype: str = "auto"
    calculate_kv_scales: bool = False  # vLLM --calculate-kv-scales: k/v scales from data
    # hybrid (Mamba / GDN) state: vLLM --mamba-cache-dtype / --mamba-ssm-cache-dtype
    # (auto | float32 | float16 | bfloat16; auto: the model config's mamba_ssm_dtype, else
    # the model dtype) and --mamba-cache-mode (none | align; deprecated as in vLLM, no
    # effect: engine/resolved_config.py derives the mode from prefix caching)
    mamba_cache_dtype: str = "auto"
    mamba_ssm_cache_dtype: str = "auto"
    mamba_cache_mode: str | None = None
    # pooling (vllm/config/model.py runner / convert, vllm/config/pooler.py; the values
    # and their resolution: engine/pooler_config.py). pooler_config: a PoolerConfig, its
    # JSON or None
    runner: str = "auto"  # auto | generate | pooling
    convert: str = "auto"  # auto | none | embed | classify
    pooler_config: PoolerConfig | str | dict | None = None

    def __post_init__(self) -> None:
        if self.max_logprobs < -1:
            raise InvalidArgumentError(f"max_logprobs must be >= -1, got {self.max_logprobs}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise InvalidArgumentError(f"device must be auto, cpu or cuda, got {self.device!r}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise InvalidArgumentError(f"unsupported dtype {self.dtype!r}")
        for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens",
                     "kv_cache_memory_bytes", "n_threads"):
            if (getattr(self, name) or 0) < 0:
                raise InvalidArgumentError(f"{name} must be >= 0, got {getattr(self, name)}")
        if isinstance(self.tensor_parallel_size, bool) or \
                not isinstance(self.tensor_parallel_size, int) or self.tensor_parallel_size < 1:
            raise InvalidArgumentError("tensor_parallel_size must be an int >= 1, got "
                                       f"{self.tensor_parallel_size!r}")
        if self.distributed_executor_backend not in (None, "mp", "external_launcher"):
            raise InvalidArgumentError("distributed_executor_backend must be mp or "
                                       f"external_launcher, got "
                                       f"{self.distributed_executor_backend!r}")
        if self.block_size not in (8, 16, 32, 64, 128):
            raise InvalidArgumentError(
                f"block_size must be one of 8, 16, 32, 64, 128, got {self.block_size}")
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise InvalidArgumentError(f"Unknown scheduling policy: {self.scheduling_policy}")
        if self.long_prefill_token_threshold < 0:
            raise InvalidArgumentError("long_prefill_token_threshold must be >= 0, got "
                                       f"{self.long_prefill_token_threshold}")
        if not 0.0 <= self.watermark < 1.0:
            raise InvalidArgumentError(f"watermark must be in [0, 1), got {self.watermark}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise InvalidArgumentError("GPU memory utilization must be in (0, 1], got "
                                       f"{self.gpu_memory_utilization}")
        if self.load_format not in ("auto", "dummy"):
            raise InvalidArgumentError(
                f"load_format must be auto or dummy, got {self.load_format!r}")
        sizes = self.cudagraph_capture_sizes
        if sizes is not None and (not isinstance(sizes, list) or any(
                isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes)):
            raise InvalidArgumentError(
                f"cudagraph_capture_sizes must be a list of positive ints, got {sizes!r}")
        if self.max_cudagraph_capture_size is not None and self.max_cudagraph_capture_size < 1:
            raise InvalidArgumentError("max_cudagraph_capture_size must be >= 1, got "
                                       f"{self.max_cudagraph_capture_size}")
        CUDAGraphMode.parse(self.cudagraph_mode)
        self._check_quantization()
        self._check_parsers()
        check_runner_convert(self.runner, self.convert)
        resolve_runner_type(self.runner, self.convert)
        self.resolved_pooler()  # a bad --pooler-config fails here, not at start-up

    @property
    def runner_type(self) -> str:
        """generate | pooling (vLLM's ModelConfig.runner_type)."""
        return resolve_runner_type(self.runner, self.convert)

    def resolved_pooler(self) -> PoolerConfig:
        """The pooler of a pooling engine (a converted decoder's defaults under the
        user's --pooler-config, a PoolerConfig, its JSON or None)."""
        user = self.pooler_config
        return resolve_pooler_config(
            user if isinstance(user, PoolerConfig | None) else PoolerConfig.from_json(user))

    def _check_quantization(self) -> None:
        """The quantization, KV-cache and Mamba-state dtypes the engine supports, with
        vLLM's messages (vllm/config/cache.py _validate_cache_dtype)."""
        if self.quantization not in SUPPORTED_QUANTIZATION:
            raise InvalidArgumentError(
                f"Unknown quantization method: {self.quantization!r}. Must be one of "
                f"{[q for q in SUPPORTED_QUANTIZATION if q]}.")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise InvalidArgumentError(f"Invalid kv_cache_dtype: {self.kv_cache_dtype!r}. "
                                       f"Valid values are: {list(KV_CACHE_DTYPES)}")
        for name in ("mamba_cache_dtype", "mamba_ssm_cache_dtype"):
            if getattr(self, name) not in MAMBA_DTYPES:
                raise InvalidArgumentError(f"{name} must be one of {list(MAMBA_DTYPES)}, "
                                           f"got {getattr(self, name)!r}")
        if self.mamba_cache_mode not in (None, "none", "align"):
            raise InvalidArgumentError("mamba_cache_mode must be none or align, got "
                                       f"{self.mamba_cache_mode!r}")

    def _check_parsers(self) -> None:
        """Parser names as vLLM's serve-args checks (unknown name, auto without parser)."""
        from libvllm.engine.reasoning import ReasoningParserManager
        from libvllm.engine.tool_parsers import ToolParserManager

        for name, manager, flag in (
                (self.reasoning_parser, ReasoningParserManager, "reasoning_parser"),
                (self.tool_call_parser, ToolParserManager, "tool_call_parser")):
            if name and name not in manager.list_registered():
                raise InvalidArgumentError(
                    f"invalid {flag} {name!r}; choose from {manager.list_registered()}")
        if self.enable_auto_tool_choice and not self.tool_call_parser:
            raise InvalidArgumentError(
                "--enable-auto-tool-choice requires --tool-call-parser")
        if self.tool_strict_level is not None:
            from libvllm.engine.tool_parsers.structural_tag import ToolStrictLevel

            ToolStrictLevel.from_name(self.tool_strict_level)
