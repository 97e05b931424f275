"""CUDA-graph modes and capture sizes (vllm/config/compilation.py: CUDAGraphMode NONE /
PIECEWISE / FULL / FULL_DECODE_ONLY / FULL_AND_PIECEWISE, cudagraph_capture_sizes and
max_cudagraph_capture_size as VllmConfig._set_cudagraph_sizes derives them). The runtime
dispatch of a step to a captured graph is engine/worker/cudagraph_dispatcher.py.

This engine has no torch.compile (vLLM's CompilationMode.NONE), and needs none to graph
a mixed step: the attention backend (one unified Triton kernel for prefill, chunked
prefill and decode rows, kernels/paged_attention.py) supports every batch in a full graph
(vLLM's AttentionCGSupport.ALWAYS, as its TritonAttentionBackend). So a piecewise part is
captured as a full graph instead of being dropped as vLLM drops it without compilation
(_normalize_piecewise_cudagraph_mode): PIECEWISE runs as FULL, and vLLM's default
FULL_AND_PIECEWISE keeps its two routines, uniform-decode graphs (one row per request: the
split-KV decode kernel) and mixed graphs over num_tokens buckets (the unified kernel).
"""

from __future__ import annotations

import enum
import logging

from libvllm.engine.errors import InvalidArgumentError

logger = logging.getLogger(__name__)

# vLLM's default (VLLM_COMPILE -O2): decode graphs on the decode kernel + mixed graphs
DEFAULT_CUDAGRAPH_MODE = "FULL_AND_PIECEWISE"
# vLLM's ceiling is 512 (1024 on data-center Blackwell): its steps past it still run
# Inductor-compiled code, ours Python-launched kernels, so decode steps of 513 to 1024
# tokens are graphed here too (eager vs graphed at vLLM's H200 default of 1024 requests:
# docs/BENCHMARKS.md, `python -m examples.bench throughput`)
_DEFAULT_MAX_GRAPH_SIZE = 1024


class CUDAGraphMode(enum.Enum):
    NONE = 0
    PIECEWISE = 1
    FULL = 2
    FULL_DECODE_ONLY = (FULL, NONE)
    FULL_AND_PIECEWISE = (FULL, PIECEWISE)

    def separate_routine(self) -> bool:
        """Whether uniform decode batches have their own graphs (a (decode, mixed) pair)."""
        return isinstance(self.value, tuple)

    def decode_mode(self) -> CUDAGraphMode:
        return CUDAGraphMode(self.value[0]) if self.separate_routine() else self

    def mixed_mode(self) -> CUDAGraphMode:
        return CUDAGraphMode(self.value[1]) if self.separate_routine() else self

    @classmethod
    def parse(cls, name: str | None) -> CUDAGraphMode:
        """A mode from its name, any case (vLLM's validate_cudagraph_mode_before)."""
        key = (DEFAULT_CUDAGRAPH_MODE if name is None else str(name)).upper()
        if key not in cls.__members__:
            raise InvalidArgumentError(
                f"cudagraph_mode must be one of {', '.join(cls.__members__)}, got {name!r}")
        return cls[key]


def resolve_cudagraph_mode(mode: CUDAGraphMode, enforce_eager: bool) -> CUDAGraphMode:
    """The mode this engine runs: NONE with enforce_eager; PIECEWISE as FULL (see the
    module docstring); every other mode as given."""
    if enforce_eager:
        return CUDAGraphMode.NONE
    if mode == CUDAGraphMode.PIECEWISE:
        logger.info("Cudagraph mode PIECEWISE is captured as FULL graphs (no compilation; "
                    "the attention backend supports every batch in a full graph).")
        return CUDAGraphMode.FULL
    return mode


def cudagraph_capture_sizes(max_num_seqs: int, max_num_batched_tokens: int,
                            sizes: list[int] | None = None,
                            max_size: int | None = None) -> list[int]:
    """Token counts to capture, ascending (VllmConfig._set_cudagraph_sizes, no speculative
    decoding): the default ceiling is min(2 * max_num_seqs, 1024), capped at
    max_num_batched_tokens; the ladder is [1, 2, 4] + range(8, 256, 8) +
    range(256, max + 1, 16), plus max_num_batched_tokens and max_num_seqs where they fit.
    Given sizes are deduplicated and cut at max_num_batched_tokens; a given max_size that
    disagrees with them is an error."""
    uniform_decode: list[int] = []
    cap = max_size
    if cap is None:
        cap = min(2 * max_num_seqs, _DEFAULT_MAX_GRAPH_SIZE)
        if max_num_seqs <= cap:
            uniform_decode = [max_num_seqs]
    cap = min(max_num_batched_tokens, cap)
    if sizes is not None:
        out = sorted({s for s in sizes if s <= max_num_batched_tokens})
    else:
        out = [s for s in (1, 2, 4) if s <= cap]
        out += list(range(8, min(cap + 1, 256), 8))
        out += list(range(256, cap + 1, 16))
        if max_num_batched_tokens <= cap:
            out.append(max_num_batched_tokens)
        out = sorted(set(out + [s for s in uniform_decode if s <= max_num_batched_tokens]))
    valid_max = out[-1] if out else 0
    if max_size is not None and max_size != valid_max:
        if sizes is not None:
            raise InvalidArgumentError(
                f"customized max_cudagraph_capture_size(={max_size}) should be consistent "
                f"with the max value of cudagraph_capture_sizes(={valid_max})")
        logger.warning("Truncating max_cudagraph_capture_size to %d", valid_max)
    return out


class CaptureSizes(list):
    """Capture sizes (ascending token counts) with the resolved mode they are for: what
    CompilationConfig.capture_sizes (engine/resolved_config.py) hands capture_model."""

    def __init__(self, sizes: list[int], mode: CUDAGraphMode) -> None:
        super().__init__(sizes if mode != CUDAGraphMode.NONE else [])
        self.mode = mode
