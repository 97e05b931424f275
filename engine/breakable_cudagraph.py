"""Breakable CUDA graphs: one capture of a forward pass cut into graph segments around the
calls that must run eagerly, replayed in order.

Mirrors vllm/compilation/breakable_cudagraph.py (BreakableCUDAGraphCapture, add_eager,
eager_break_during_capture and its weak references to the arguments), vLLM's piecewise
capture for a model without torch.compile. Here it carries the mixed prefill/decode
steps of hybrid GDN models: the GDN core (conv + gated delta rule over the step's real
rows, vLLM's `qwen_gdn_attention_core` splitting op) runs eagerly between two graph
segments (engine/layers/gdn.py), everything else (projections, norms, attention, MoE)
replays from graphs. An eager call reads and writes tensors at the addresses it saw at
capture (outputs written in place), so the segments after it read its results.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch


class _Borrowed:
    """Device memory described by address (__cuda_array_interface__), owning nothing."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                         "data": (ptr, False), "version": 3,
                                         "strides": None}


def weak_ref_tensor(t: torch.Tensor) -> torch.Tensor:
    """A tensor over t's memory that does not keep it allocated (vLLM's weak_ref_tensor):
    an eager call's arguments, which the graph pool may hand to another capture once
    the forward that made them drops them. CPU tensors (no graphs) are returned as is."""
    if t.device.type != "cuda" or t.numel() == 0:
        return t
    span = sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1  # elements
    raw = torch.as_tensor(_Borrowed(t.data_ptr(), span * t.element_size()), device=t.device)
    return raw.view(t.dtype).as_strided(t.shape, t.stride())


class BreakableCapture:
    """A stream capture that eager calls cut into segments (add_eager); replay() runs the
    graph segments and eager calls in capture order. Run it on a side stream, as any
    capture; one at a time per thread."""

    _tls = threading.local()

    def __init__(self, pool: Any = None, graph_cls: type = torch.cuda.CUDAGraph) -> None:
        self.pool = pool
        self.graph_cls = graph_cls
        self.segments: list[Callable[[], Any]] = []  # graph replays and eager calls
        self.num_graphs = 0
        self.num_eager_breaks = 0
        self._graph = None

    @classmethod
    def current(cls) -> BreakableCapture | None:
        return getattr(cls._tls, "active", None)

    def __enter__(self) -> BreakableCapture:
        if BreakableCapture.current() is not None:
            raise RuntimeError("Nested BreakableCUDAGraphCapture is not supported.")
        BreakableCapture._tls.active = self
        self._begin_segment()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._end_segment()
        finally:
            BreakableCapture._tls.active = None

    def _begin_segment(self) -> None:
        self._graph = self.graph_cls()
        if self.pool is not None:
            self._graph.capture_begin(pool=self.pool)
        else:
            self._graph.capture_begin()

    def _end_segment(self) -> None:
        if self._graph is None:
            return
        self._graph.capture_end()
        self.segments.append(self._graph.replay)
        self.num_graphs += 1
        self._graph = None

    def add_eager(self, fn: Callable[..., Any], *args: Any) -> Any:
        """End the segment, run fn(*args) now (not captured) and keep it for replay, on
        weak references to the tensor arguments (taken once the segment has ended, no
        capture under way); start the next segment; -> fn's result of this run."""
        self._end_segment()
        weak = tuple(weak_ref_tensor(a) if isinstance(a, torch.Tensor) else a for a in args)
        result = fn(*weak)
        self.segments.append(lambda: fn(*weak))
        self.num_eager_breaks += 1
        self._begin_segment()
        return result

    def replay(self) -> None:
        for segment in self.segments:
            segment()


def eager_break(fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args) now; inside a capture, as an eager break whose replays call fn on weak
    references to the tensor arguments (vLLM's eager_break_during_capture). fn must write
    its results into argument tensors, never return new ones the graph reads."""
    capture = BreakableCapture.current()
    if capture is None:
        return fn(*args)
    return capture.add_eager(fn, *args)
