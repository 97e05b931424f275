"""EngineConfig: the one flat configuration of an engine (vLLM's EngineArgs, flattened).

Mirrors the names and defaults of vllm/engine/arg_utils.py (EngineArgs) for the fields
that exist so far, and the checks of vllm/config/scheduler.py (SchedulerConfig).
0 / None means "derive from the model or the machine".
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import InvalidArgumentError


@dataclass
class EngineConfig:
    model: str
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    max_model_len: int = 0  # 0: the model's context length
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 0  # 0: derived (vLLM: 8192 when chunked prefill is on)
    block_size: int = 16
    kv_cache_memory_bytes: int = 0  # 0: derived from device memory
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    seed: int = 0
    enforce_eager: bool = False
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
    enable_auto_tool_choice: bool = False  # tool_choice "auto" (needs tool_call_parser)
    tool_call_parser: str = ""  # "": none; hermes | llama3_json | mistral | pythonic | ...

    def __post_init__(self) -> None:
        if self.max_logprobs < -1:
            raise InvalidArgumentError(f"max_logprobs must be >= -1, got {self.max_logprobs}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise InvalidArgumentError(f"device must be auto, cpu or cuda, got {self.device!r}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise InvalidArgumentError(f"unsupported dtype {self.dtype!r}")
        for name in ("max_model_len", "max_num_batched_tokens", "kv_cache_memory_bytes"):
            if getattr(self, name) < 0:
                raise InvalidArgumentError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.max_num_seqs < 1:
            raise InvalidArgumentError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
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
        self._check_parsers()

    def _check_parsers(self) -> None:
        """Parser names as vLLM's serve-args checks (unknown name, auto without parser)."""
        from engine.reasoning import ReasoningParserManager
        from engine.tool_parsers import ToolParserManager

        for name, manager, flag in (
                (self.reasoning_parser, ReasoningParserManager, "reasoning_parser"),
                (self.tool_call_parser, ToolParserManager, "tool_call_parser")):
            if name and name not in manager.list_registered():
                raise InvalidArgumentError(
                    f"invalid {flag} {name!r}; choose from {manager.list_registered()}")
        if self.enable_auto_tool_choice and not self.tool_call_parser:
            raise InvalidArgumentError(
                "--enable-auto-tool-choice requires --tool-call-parser")

    def verify_max_model_len(self, max_model_len: int) -> None:
        """vllm/config/scheduler.py::SchedulerConfig.verify_max_model_len."""
        batched = self.max_num_batched_tokens
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
