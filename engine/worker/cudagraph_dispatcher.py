"""The runtime dispatch of a step to a captured CUDA graph (vllm/v1/cudagraph_dispatcher.py):
BatchDescriptor keys, padding a step's token count up to the next capture size, FULL keys
for mixed batches and, with a separate decode routine, uniform-decode keys. The modes and
capture sizes are engine/compilation_config.py. Own code.

The decode routine stays separate from the mixed one because the split-KV decode kernel
takes about 19% less time than the unified one on 64 and 256 decode rows at 1k context
(H200; docs/BENCHMARKS.md, attention kernels).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from libvllm.engine.compilation_config import CUDAGraphMode
from libvllm.engine.errors import InvalidArgumentError


@dataclass(frozen=True)
class BatchDescriptor:
    """The key of a captured graph (vllm/forward_context.py): padded token count, the
    request rows its attention metadata has, and whether it is a uniform decode batch."""

    num_tokens: int
    num_reqs: int | None = None
    uniform: bool = False


class CudagraphDispatcher:
    """Which graph, if any, runs a step (vllm/v1/cudagraph_dispatcher.py)."""

    def __init__(self, mode: CUDAGraphMode, capture_sizes: list[int], max_num_seqs: int
                 ) -> None:
        if mode == CUDAGraphMode.PIECEWISE:
            raise InvalidArgumentError("cudagraph_mode PIECEWISE has no routine here; "
                                       "resolve it first (resolve_cudagraph_mode)")
        self.mode = mode
        self.capture_sizes = sorted(set(capture_sizes)) if mode != CUDAGraphMode.NONE else []
        self.max_num_seqs = max_num_seqs
        self.keys: set[BatchDescriptor] = set()
        if not self.capture_sizes:
            return
        if mode.mixed_mode() != CUDAGraphMode.NONE:  # FULL, or PIECEWISE captured as FULL
            self.keys |= {self._descriptor(s, False) for s in self.capture_sizes}
        if mode.decode_mode() == CUDAGraphMode.FULL and mode.separate_routine():
            self.keys |= {self._descriptor(s, True) for s in self.capture_sizes
                          if s <= max_num_seqs}

    @property
    def max_capture_size(self) -> int:
        return self.capture_sizes[-1] if self.capture_sizes else 0

    def _padded(self, num_tokens: int) -> int:
        return self.capture_sizes[bisect.bisect_left(self.capture_sizes, num_tokens)]

    def _descriptor(self, num_tokens: int, uniform: bool) -> BatchDescriptor:
        padded = self._padded(num_tokens)
        return BatchDescriptor(padded, min(padded, self.max_num_seqs), uniform)

    def dispatch(self, num_tokens: int, uniform_decode: bool) -> BatchDescriptor | None:
        """The graph for a step of num_tokens tokens (uniform_decode: one per request);
        None: run eagerly (no graphs, or more tokens than the largest capture size)."""
        if not self.keys or num_tokens > self.max_capture_size or num_tokens < 1:
            return None
        if uniform_decode and self.mode.separate_routine():
            desc = self._descriptor(num_tokens, True)
            if desc in self.keys:
                return desc
        desc = self._descriptor(num_tokens, False)  # also a decode batch past max_num_seqs
        return desc if desc in self.keys else None

    def capture_descs(self) -> list[BatchDescriptor]:
        """Every key, largest first (smaller graphs reuse the larger ones' pool memory)."""
        return sorted(self.keys, key=lambda d: (d.num_tokens, d.uniform), reverse=True)
