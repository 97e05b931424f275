"""Persistent, preallocated input buffers of the model runner and its block table.

Mirrors vllm/v1/worker/gpu_input_batch.py / gpu_model_runner.py (CpuGpuBuffer: a pinned
host tensor with a numpy view, filled on the host, copied to its device twin with one
non_blocking copy per step) and vllm/v1/worker/block_table.py (BlockTable: one row of
block ids per live request, appended to as the KV cache manager hands out blocks, the
rows of a step gathered and committed to the device in one copy). Buffers never move, so
a CUDA graph captured over their device views stays valid; on CPU the "device" tensor is
the host tensor itself and nothing is copied.
"""

from __future__ import annotations

import numpy as np
import torch

from libvllm.engine.errors import OutOfResourcesError


class CpuGpuBuffer:
    """A host tensor (pinned on CUDA) + numpy view + same-shape device tensor."""

    def __init__(self, *shape: int, dtype: torch.dtype, device: torch.device) -> None:
        on_cuda = device.type == "cuda"
        self.cpu = torch.zeros(*shape, dtype=dtype, pin_memory=on_cuda)
        self.np = self.cpu.numpy()
        self.gpu = torch.zeros(*shape, dtype=dtype, device=device) if on_cuda else self.cpu

    def copy_to_gpu(self, n: int) -> torch.Tensor:
        """The first n rows on the device (queued copy; no host sync)."""
        if self.gpu is not self.cpu:
            self.gpu[:n].copy_(self.cpu[:n], non_blocking=True)
        return self.gpu[:n]


class BlockTable:
    """Block ids of every live request ([max_num_reqs, max_num_blocks] int32 rows); the
    step's table has `pad_rows` more rows (a CUDA graph's padding request)."""

    def __init__(self, max_num_reqs: int, max_num_blocks: int, device: torch.device,
                 pad_rows: int = 0) -> None:
        self.max_num_blocks = max_num_blocks
        self.rows = np.zeros((max_num_reqs, max_num_blocks), dtype=np.int32)
        self.num_blocks = np.zeros(max_num_reqs, dtype=np.int32)
        self._free = list(range(max_num_reqs - 1, -1, -1))
        self.step = CpuGpuBuffer(max_num_reqs + pad_rows, max_num_blocks, dtype=torch.int32,
                                 device=device)

    def add_row(self, block_ids: list[int]) -> int:
        if not self._free:
            raise OutOfResourcesError(f"more than {len(self.rows)} requests hold KV blocks")
        row = self._free.pop()
        self.num_blocks[row] = 0
        self.append(row, block_ids)
        return row

    def append(self, row: int, block_ids: list[int]) -> None:
        start = int(self.num_blocks[row])
        end = start + len(block_ids)
        if end > self.max_num_blocks:
            raise OutOfResourcesError(f"a request holds {end} KV blocks, more than "
                                      f"max_model_len allows ({self.max_num_blocks})")
        self.rows[row, start:end] = block_ids
        self.num_blocks[row] = end

    def free_row(self, row: int) -> None:
        self._free.append(row)

    def commit(self, rows: np.ndarray) -> torch.Tensor:
        """The step's block table [len(rows), max_num_blocks] int32 on the device, row i =
        request rows[i]; its host copy stays readable in `self.step.np`."""
        n = len(rows)
        np.take(self.rows, rows, axis=0, out=self.step.np[:n])
        return self.step.copy_to_gpu(n)
