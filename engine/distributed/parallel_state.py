"""The tensor-parallel group of this process, as vllm/distributed/parallel_state.py
(init_distributed_environment, initialize_model_parallel, get_tp_group,
get_tensor_model_parallel_rank / _world_size, destroy_model_parallel,
destroy_distributed_environment).

torch.distributed, rendezvous at the caller's init method (the multiproc executor's fresh
tcp:// address, or env:// from the launcher's MASTER_ADDR / MASTER_PORT for vLLM's external
launcher): backend gloo on CPU, nccl on CUDA. Beside the device group, a gloo CPU group
(vLLM's GroupCoordinator.cpu_group) carries host data such as the step broadcast. Without
an initialized group this process is rank 0 of 1 and every collective is the identity.

Group names: torch names the default group and each new_group by a process-wide counter
(distributed_c10d's _world.group_count) and prefixes the group's store keys with it, so the
ranks of one group meet only if they count alike. A fresh worker process starts at 0;
rank 0 of an in-process engine may have made groups before. destroy_process_group() resets
the counter to 0, but an init_process_group that failed (the name is taken before the
rendezvous: a worker that died at start-up, a timeout) leaves it advanced, and the next
group's rank 0 would wait under a prefix its workers never write. With no default group
there is no group at all, so joining starts the count at 0 as destroy_process_group does.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from libvllm.engine.errors import InvalidArgumentError


@dataclass
class GroupCoordinator:
    rank_in_group: int
    world_size: int
    device_group: object  # a torch ProcessGroup (gloo or nccl)
    cpu_group: object  # a gloo ProcessGroup for host tensors


_TP: GroupCoordinator | None = None


def init_distributed_environment(world_size: int, rank: int, backend: str = "gloo",
                                 init_method: str = "env://",
                                 timeout: timedelta | None = None) -> None:
    """Join the default process group (once per process)."""
    if not 0 <= rank < world_size:
        raise InvalidArgumentError(f"rank {rank} is not in [0, {world_size})")
    if not dist.is_initialized():
        _reset_group_names()
        dist.init_process_group(backend, init_method=init_method, world_size=world_size,
                                rank=rank, timeout=timeout)


def _reset_group_names() -> None:
    """Start torch's group-name counter at 0, as destroy_process_group(WORLD) leaves it
    (only while no default group exists: every other group hangs off it)."""
    dist.distributed_c10d._world.group_count = 0


def initialize_model_parallel(tensor_model_parallel_size: int) -> None:
    """Make the whole world one tensor-parallel group (no pipeline parallel yet)."""
    global _TP
    world = dist.get_world_size()
    if tensor_model_parallel_size != world:
        raise InvalidArgumentError(f"tensor_parallel_size {tensor_model_parallel_size} "
                                   f"!= world size {world}")
    ranks = list(range(world))
    device_group = dist.group.WORLD
    cpu_group = device_group if dist.get_backend() == "gloo" else \
        dist.new_group(ranks, backend="gloo")
    _TP = GroupCoordinator(dist.get_rank(), world, device_group, cpu_group)


def model_parallel_is_initialized() -> bool:
    return _TP is not None


def get_tp_group() -> GroupCoordinator | None:
    return _TP


def get_tensor_model_parallel_world_size() -> int:
    return 1 if _TP is None else _TP.world_size


def get_tensor_model_parallel_rank() -> int:
    return 0 if _TP is None else _TP.rank_in_group


def destroy_model_parallel() -> None:
    global _TP
    _TP = None


def destroy_distributed_environment() -> None:
    destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


def device_backend(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"
