"""Host -> device helpers of the sampler, as vllm/utils/torch_utils.py
(async_tensor_h2d, make_tensor_with_pad).

Per-step sampling inputs are built from Python lists after the forward pass has been
queued; on CUDA they go through pinned memory with non_blocking copies, so building
them never waits for the GPU (a pageable host->device copy would sync the stream).
"""

from __future__ import annotations

import torch


def async_tensor_h2d(data: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    pin = torch.device(device).type == "cuda"
    return torch.tensor(data, dtype=dtype, pin_memory=pin).to(device, non_blocking=pin)


def make_tensor_with_pad(rows: list[list[int]], pad: int, device: torch.device) -> torch.Tensor:
    """[len(rows), max row length] int64 on device, right-padded with `pad`."""
    width = max(map(len, rows), default=0)
    padded = [row + [pad] * (width - len(row)) for row in rows]
    return async_tensor_h2d(padded, torch.long, device).reshape(len(rows), width)
