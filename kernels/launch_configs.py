"""The launch-config records of the Triton kernels: frozen dataclasses of named int fields.

A launcher takes `config: <Record> | None` (None: its kernel's config function, whose
docstring states the rule and the command that measures it); kernels/tuned_configs.py
parses tuned JSON files into these records and names the file when a value is invalid.
Own code; the GEMM record's keys are vLLM's Triton kernel parameters
(vllm/model_executor/layers/fused_moe/fused_moe.py get_default_config,
vllm/model_executor/layers/quantization/utils/fp8_utils.py w8a8_triton_block_scaled_mm).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    """Base of the records: every field an int >= 1 (>= 0 for those named in MAY_BE_0; or
    None where its default is None), those named in POW2 powers of two."""

    POW2: ClassVar[tuple[str, ...]] = ()
    MAY_BE_0: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is None and f.default is None:
                continue
            low = 0 if f.name in self.MAY_BE_0 else 1
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise ValueError(f"{f.name} must be an int >= {low}, got {v!r}")
            if f.name in self.POW2 and v & (v - 1):
                raise ValueError(f"{f.name} must be a power of two, got {v}")


@dataclasses.dataclass(frozen=True)
class GemvConfig(LaunchConfig):
    """A row-block GEMV's launch (kernels/gemv.py and its fp8, rope-cache and MoE
    variants): block_n weight rows a program streamed in block_k-wide steps."""

    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    POW2: ClassVar[tuple[str, ...]] = ("block_n", "block_k", "num_warps")


@dataclasses.dataclass(frozen=True)
class GemmConfig(LaunchConfig):
    """A grouped Triton GEMM's launch in vLLM's keys (kernels/fused_moe.py,
    kernels/fp8_block_gemm.py); kwargs() is the dict the launchers take."""

    BLOCK_SIZE_M: int
    BLOCK_SIZE_N: int
    BLOCK_SIZE_K: int
    GROUP_SIZE_M: int
    num_warps: int
    num_stages: int
    SPLIT_K: int | None = None
    num_ctas: int | None = None  # a Triton launch option some of vLLM's NVIDIA files set
    POW2: ClassVar[tuple[str, ...]] = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K",
                                       "num_warps")

    def kwargs(self) -> dict[str, int]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclasses.dataclass(frozen=True)
class GgufBlocksConfig(LaunchConfig):
    """A GGUF row kernel's launch (kernels/gguf_gemm.py gguf_gemv and gguf_dequantize,
    kernels/gguf_kquant_mmq.py kquant_dequantize): block_n weight rows a program, `blocks`
    quant blocks (super-blocks for the K-quants) a step."""

    block_n: int
    blocks: int
    num_warps: int
    POW2: ClassVar[tuple[str, ...]] = ("block_n", "blocks", "num_warps")


@dataclasses.dataclass(frozen=True)
class GgufMmqConfig(LaunchConfig):
    """kernels/gguf_gemm.py gguf_mmq's launch: a [block_m tokens, block_n rows] tile."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    POW2: ClassVar[tuple[str, ...]] = ("block_m", "block_n", "num_warps")


@dataclasses.dataclass(frozen=True)
class KquantMmqConfig(LaunchConfig):
    """kernels/gguf_kquant_mmq.py kquant_mmq's launch: block_n weight rows x block_m
    tokens a program, K split over split_k programs."""

    block_n: int
    block_m: int
    num_warps: int
    num_stages: int
    split_k: int
    POW2: ClassVar[tuple[str, ...]] = ("block_n", "block_m", "num_warps")


@dataclasses.dataclass(frozen=True)
class MmvqConfig(LaunchConfig):
    """kernels/gguf_mmvq.py gguf_mmvq_q8_1's launch: block_n rows a program, `blocks`
    quant blocks a step, and the layout of the work (0: two lanes a sub-block; 1: a lane
    per sub-block, kernels/gguf_mmvq_lanes.py; 2: layout 1 reading the weights past L1)."""

    block_n: int
    blocks: int
    num_warps: int
    layout: int = 0
    POW2: ClassVar[tuple[str, ...]] = ("block_n", "blocks", "num_warps")
    MAY_BE_0: ClassVar[tuple[str, ...]] = ("layout",)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.layout > 2:
            raise ValueError(f"layout must be 0, 1 or 2, got {self.layout}")
