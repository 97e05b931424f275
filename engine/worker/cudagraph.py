"""CUDA graphs of the model's forward pass for uniform decode batches (one token per request).

Mirrors vllm/v1/worker/gpu_model_runner.py (capture_model / _dummy_run over
cudagraph_batch_sizes, largest first into one shared memory pool) and
vllm/compilation/cuda_graph.py (CUDAGraphWrapper: replay when the padded batch size was
captured). A graph reads the runner's persistent device buffers (input ids, positions,
slot mapping, sequence lengths, block table), so a step only fills those buffers and
replays; batches are padded up to the next captured size with seq_len 0 (attention
yields zeros) and slot -1 (no KV write). Logits and sampling run outside the graph.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable

import torch

logger = logging.getLogger(__name__)

_WARMUP_RUNS = 2  # Triton JIT and cuBLAS handles before capture


class DecodeCudaGraphs:
    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sorted(sizes)
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.capture_time_s = 0.0

    def padded_size(self, num_reqs: int) -> int | None:
        """The smallest captured size >= num_reqs; None when the batch is larger."""
        i = bisect.bisect_left(self.sizes, num_reqs)
        return self.sizes[i] if i < len(self.sizes) else None

    @torch.inference_mode()
    def capture(self, forward: Callable[[int], torch.Tensor]) -> None:
        """forward(batch_size) runs the model over the first batch_size rows of the
        persistent buffers (already holding padding values) and returns hidden states."""
        start = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        for bs in reversed(self.sizes):
            for _ in range(_WARMUP_RUNS):
                forward(bs)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                out = forward(bs)  # [bs, hidden], lives in the graph's pool
            self._graphs[bs] = (graph, out)
        torch.cuda.synchronize()
        self.capture_time_s = time.perf_counter() - start
        logger.info("captured %d decode CUDA graphs (batch sizes %d..%d) in %.2f s",
                    len(self.sizes), self.sizes[0], self.sizes[-1], self.capture_time_s)

    def replay(self, bs: int) -> torch.Tensor:
        """Hidden states [bs, hidden] of the captured batch size bs (reused next replay)."""
        graph, out = self._graphs[bs]
        graph.replay()
        return out
