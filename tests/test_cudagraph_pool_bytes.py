"""CudaGraphs.pool_bytes (engine/worker/cudagraph.py) is the memory the graphs' pool holds,
whatever the allocator had cached before capture: torch.cuda.graph empties the cache as it
enters (torch/cuda/graphs.py), which made the measure negative on the H200 (Qwen3.5-35B-A3B
start-up: cudagraph_pool -15,437,135,872 bytes). Captures run as vLLM's bulk capture
(vllm/utils/gc_utils.py freeze_gc_for_cudagraph_capture, vllm/compilation/cuda_graph.py's
gc.collect / empty_cache patches): the cache flush torch.cuda.graph does as it enters is a
no-op while capturing (the cache is emptied once before and once after), and gc stays
frozen. CPU: torch.cuda's allocator calls are stood in
for by a fake that caches, empties and captures."""

from __future__ import annotations

import contextlib
import gc

import torch

from libvllm.engine.worker import cudagraph
from libvllm.engine.worker.cudagraph_dispatcher import BatchDescriptor


class _FakeAllocator:
    """60 bytes live, 40 cached and free; each capture adds 10 to the graphs' pool."""

    def __init__(self) -> None:
        self.live, self.cached, self.pool = 60, 40, 0
        self.flushes = 0  # empty_cache calls

    def memory_reserved(self) -> int:
        return self.live + self.cached + self.pool

    def empty_cache(self) -> None:
        self.cached = 0
        self.flushes += 1

    @contextlib.contextmanager
    def graph(self, graph, pool=None):
        torch.cuda.empty_cache()  # as torch.cuda.graph.__enter__
        yield
        self.pool += 10


class _Dispatcher:
    mode = type("Mode", (), {"name": "FULL"})
    capture_sizes = [1, 2]
    max_capture_size = 2

    def capture_descs(self):
        return [BatchDescriptor(2, False), BatchDescriptor(1, False)]


def _fake_cuda(monkeypatch) -> _FakeAllocator:
    fake = _FakeAllocator()
    for name in ("memory_reserved", "empty_cache", "graph"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: object())
    return fake


def test_pool_bytes_counts_the_graphs_not_the_emptied_cache(monkeypatch):
    _fake_cuda(monkeypatch)
    graphs = cudagraph.CudaGraphs(_Dispatcher())
    graphs.capture(lambda desc: torch.zeros(desc.num_tokens, 4))
    assert graphs.pool_bytes == 20  # two graphs; the 40 cached bytes freed are not counted


def test_captures_keep_the_cache_and_gc_frozen(monkeypatch):
    """A compile-only pass over every graph's forward comes first (kernels/_common.py
    precompile_triton), then the captures without eager warm-ups (vLLM's
    cudagraph_num_of_warmups 0). The pass's cached blocks are emptied once before the
    captures, then each capture's survive the next capture's entry (no free / re-malloc per
    graph); the cache is emptied once more after; gc is off while capturing and restored
    after."""
    fake = _fake_cuda(monkeypatch)
    seen = []
    compiling = []

    @contextlib.contextmanager
    def precompile():
        compiling.append(True)
        yield
        compiling.pop()

    def forward(desc):
        fake.cached += 5  # a compile-only or capture run caches some blocks
        seen.append((desc.num_tokens, fake.cached, gc.isenabled(), bool(compiling)))
        return torch.zeros(desc.num_tokens, 4)

    monkeypatch.setattr(cudagraph, "precompile_triton", precompile)
    graphs = cudagraph.CudaGraphs(_Dispatcher())
    graphs.capture(forward)
    assert seen == [(2, 45, True, True), (1, 50, True, True),  # the compile-only pass
                    (2, 5, False, False), (1, 10, False, False)]  # captures, one each
    assert gc.isenabled()
    assert fake.flushes == 2 and fake.cached == 0
    assert graphs.pool_bytes == 20
