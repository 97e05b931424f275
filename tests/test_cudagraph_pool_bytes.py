"""CudaGraphs.pool_bytes (engine/worker/cudagraph.py) is the memory the graphs' pool holds,
whatever the allocator had cached before capture: torch.cuda.graph empties the cache as it
enters (torch/cuda/graphs.py), which made the measure negative on the H200 (Qwen3.5-35B-A3B
start-up: cudagraph_pool -15,437,135,872 bytes). CPU: torch.cuda's allocator calls are
stood in for by a fake that caches, empties and captures."""

from __future__ import annotations

import contextlib

import torch

from engine.worker import cudagraph
from engine.worker.cudagraph_dispatcher import BatchDescriptor


class _FakeAllocator:
    """60 bytes live, 40 cached and free; each capture adds 10 to the graphs' pool."""

    def __init__(self) -> None:
        self.live, self.cached, self.pool = 60, 40, 0

    def memory_reserved(self) -> int:
        return self.live + self.cached + self.pool

    def empty_cache(self) -> None:
        self.cached = 0

    @contextlib.contextmanager
    def graph(self, graph, pool=None):
        self.empty_cache()  # as torch.cuda.graph.__enter__
        yield
        self.pool += 10


class _Dispatcher:
    mode = type("Mode", (), {"name": "FULL"})
    capture_sizes = [1, 2]
    max_capture_size = 2

    def capture_descs(self):
        return [BatchDescriptor(2, False), BatchDescriptor(1, False)]


def test_pool_bytes_counts_the_graphs_not_the_emptied_cache(monkeypatch):
    fake = _FakeAllocator()
    for name in ("memory_reserved", "empty_cache", "graph"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: object())
    graphs = cudagraph.CudaGraphs(_Dispatcher())
    graphs.capture(lambda desc: torch.zeros(desc.num_tokens, 4))
    assert graphs.pool_bytes == 20  # two graphs; the 40 cached bytes freed are not counted
