"""Collectives over the tensor-parallel group, as vllm/distributed/communication_op.py
(tensor_model_parallel_all_reduce, tensor_model_parallel_all_gather) plus the host-side
byte broadcast the executor uses (vLLM's broadcast on the GroupCoordinator's cpu_group).
Each is the identity at tensor_parallel_size 1.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from libvllm.engine.distributed.parallel_state import get_tp_group


def tensor_model_parallel_all_reduce(input_: torch.Tensor) -> torch.Tensor:
    """Sum of `input_` over the ranks (in place when a group exists)."""
    tp = get_tp_group()
    if tp is None or tp.world_size == 1:
        return input_
    dist.all_reduce(input_, group=tp.device_group)
    return input_


def tensor_model_parallel_all_gather(input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The ranks' tensors concatenated along `dim`, rank order."""
    tp = get_tp_group()
    if tp is None or tp.world_size == 1:
        return input_
    parts = [torch.empty_like(input_) for _ in range(tp.world_size)]
    dist.all_gather(parts, input_.contiguous(), group=tp.device_group)
    return torch.cat(parts, dim=dim)


def broadcast_bytes(data: bytes | None, src: int = 0) -> bytes:
    """Rank `src` sends `data`; every rank returns it (length, then a uint8 tensor)."""
    tp = get_tp_group()
    if tp is None or tp.world_size == 1:
        return data or b""
    group = tp.cpu_group
    is_src = tp.rank_in_group == src
    size = torch.tensor([len(data) if is_src else 0], dtype=torch.int64)
    dist.broadcast(size, src, group=group)
    buf = torch.frombuffer(bytearray(data), dtype=torch.uint8) if is_src and data else \
        torch.empty(int(size), dtype=torch.uint8)
    if int(size):
        dist.broadcast(buf, src, group=group)
    return bytes(buf.numpy())
