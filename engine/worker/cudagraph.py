"""Full CUDA graphs of the model's forward pass, one per BatchDescriptor of the dispatcher.

Mirrors vllm/v1/worker/gpu_model_runner.py (capture_model / _capture_cudagraphs /
_dummy_run: largest first into one shared memory pool, cudagraph_num_of_warmups eager runs
each (vllm/config/compilation.py: 0), the capture time logged) and
vllm/compilation/cuda_graph.py (CUDAGraphWrapper: replay the graph of the dispatched key).
A graph reads the runner's persistent device buffers (input ids,
positions, slot mapping, query start locations, sequence lengths, block table), so a step
only fills those buffers and replays. Padding (engine/worker/model_runner.py): tokens
past the step's own go to one padding request row with seq_len 0 (attention yields zeros)
and slot -1 (no KV write); request rows past it have no tokens. Logits and sampling run
outside the graph. Captures run as vLLM's do: gc collected once and frozen
(vllm/utils/gc_utils.py freeze_gc_for_cudagraph_capture), and torch.cuda.graph's emptying
of the allocator caches as it enters patched out (CUDAGraphWrapper's gc_disable), so each
capture does not free and re-allocate the memory of the runs before it. Before the
captures, one pass over every descriptor runs the forward with its Triton launches only
compiling, side by side (kernels/_common.py precompile_triton): the captures compile
nothing (a new variant's module still loads at its first launch, inside its capture, as in
vLLM's captures without warm-ups), and what the forward sets up lazily in Python or torch
(handles, caches) is set up outside them. Inside one eager warm-up each, one compile at a
time, Llama-8B's cold capture took 20.7 s on the H200 (docs/BENCHMARKS.md).

Descriptors the runner marks breakable (hybrid GDN models' mixed steps, whose GDN core
supports uniform decode batches only: vLLM's AttentionCGSupport.UNIFORM_BATCH) are
captured as breakable graphs (engine/breakable_cudagraph.py, vLLM's piecewise capture
without torch.compile): graph segments with the GDN core run eagerly between them, on a
side stream, into the same pool.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections.abc import Callable, Iterator
from unittest import mock

import torch

from libvllm.engine.breakable_cudagraph import BreakableCapture
from libvllm.engine.worker.cudagraph_dispatcher import BatchDescriptor, CudagraphDispatcher
from libvllm.kernels._common import precompile_triton

logger = logging.getLogger(__name__)

_WARMUP_RUNS = 0  # vLLM's cudagraph_num_of_warmups default (the compile pass runs first)


class CudaGraphs:
    def __init__(self, dispatcher: CudagraphDispatcher,
                 breakable: Callable[[BatchDescriptor], bool] | None = None) -> None:
        self.dispatcher = dispatcher
        self.breakable = breakable or (lambda desc: False)
        # per key: (a graph or a breakable capture, its output)
        self._graphs: dict[BatchDescriptor, tuple[torch.cuda.CUDAGraph | BreakableCapture,
                                                  torch.Tensor]] = {}
        self.capture_time_s = 0.0
        self.pool_bytes = 0  # device memory the graphs' pool holds after capture

    @torch.inference_mode()
    def capture(self, forward: Callable[[BatchDescriptor], torch.Tensor]) -> None:
        """forward(desc) runs the model over the first desc.num_tokens rows of the
        persistent buffers (set to padding values by it) and returns hidden states."""
        start = time.perf_counter()
        descs = self.dispatcher.capture_descs()
        with precompile_triton():  # every capture's Triton variants, side by side
            for desc in descs:
                forward(desc)
        # torch.cuda.graph empties the allocator's cache as it enters; emptied first here
        # too, so the blocks it releases do not count against the pool (the Qwen3.5-35B-A3B
        # start-up on the H200 reported -14.4 GiB)
        torch.cuda.empty_cache()
        before = torch.cuda.memory_reserved()
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream() if any(map(self.breakable, descs)) else None
        with _bulk_capture():
            for desc in descs:
                for _ in range(_WARMUP_RUNS):
                    forward(desc)
                torch.cuda.synchronize()
                if self.breakable(desc):
                    with torch.cuda.stream(side), BreakableCapture(pool) as graph:
                        out = forward(desc)
                    torch.cuda.current_stream().wait_stream(side)
                else:
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool):
                        out = forward(desc)  # [num_tokens, hidden], lives in the pool
                self._graphs[desc] = (graph, out)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # the warm-ups' cached blocks; the pool's stay
        self.capture_time_s = time.perf_counter() - start
        self.pool_bytes = torch.cuda.memory_reserved() - before
        logger.info("captured %d CUDA graphs (cudagraph_mode %s, %d..%d tokens; %d "
                    "breakable) in %.2f s, %.0f MiB", len(self._graphs),
                    self.dispatcher.mode.name, self.dispatcher.capture_sizes[0],
                    self.dispatcher.max_capture_size, self.num_breakable,
                    self.capture_time_s, self.pool_bytes / (1 << 20))

    @property
    def num_breakable(self) -> int:
        """Captured graphs with eager breaks."""
        return sum(isinstance(g, BreakableCapture) for g, _ in self._graphs.values())

    def replay(self, desc: BatchDescriptor) -> torch.Tensor:
        """Hidden states [desc.num_tokens, hidden] (overwritten by the next replay)."""
        graph, out = self._graphs[desc]
        graph.replay()
        return out


@contextlib.contextmanager
def _bulk_capture() -> Iterator[None]:
    """gc collected once and frozen, collected again after; torch.cuda.graph's cache flushes
    (device allocator and pinned host memory) made no-ops for the captures inside."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(mock.patch.object(torch.cuda, "empty_cache", lambda: None))
            if hasattr(torch._C, "_host_emptyCache"):
                stack.enter_context(mock.patch.object(torch._C, "_host_emptyCache",
                                                      lambda: None))
            yield
    finally:
        gc.unfreeze()
        gc.collect()
        if was_enabled:
            gc.enable()
