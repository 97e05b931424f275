"""EngineConfig: the one flat configuration of an engine (vLLM's EngineArgs, flattened).

Mirrors the names and defaults of vllm/engine/arg_utils.py (EngineArgs) for the fields
that exist so far. 0 / None means "derive from the model or the machine".
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
    served_model_name: str | None = None

    def __post_init__(self) -> None:
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
