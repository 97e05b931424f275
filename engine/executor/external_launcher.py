"""distributed_executor_backend "external_launcher": every rank is a process started by
the user's launcher (torchrun, a cluster scheduler), each running its own engine on the
same requests, as vLLM's ExecutorWithExternalLauncher (vllm/v1/executor/uniproc_executor.py).

No worker processes and no broadcast: every rank schedules the same requests the same way
(the scheduler is deterministic) and its collectives pair up with the other ranks'. The
rendezvous is torch.distributed env:// from the launcher's variables (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT); this is how tensor parallelism spans machines.
"""

from __future__ import annotations

import torch

from libvllm.engine import envs
from libvllm.engine.config import EngineConfig
from libvllm.engine.core.sched_output import GrammarOutput, SchedulerOutput
from libvllm.engine.distributed.parallel_state import (
    destroy_distributed_environment,
    init_distributed_environment,
    initialize_model_parallel,
)
from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.executor.multiproc_executor import dist_timeout
from libvllm.engine.resolved_config import ResolvedConfig

_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class ExternalLauncherExecutor:
    """The executor hooks of engine/engine_core/engine_core.py, with nothing to send."""

    def __init__(self, config: EngineConfig, backend: str) -> None:
        missing = [v for v in _ENV if getattr(envs, v) is None]
        if missing:
            raise InvalidArgumentError(f"distributed_executor_backend external_launcher "
                                       f"needs {', '.join(missing)} in the environment")
        world = envs.WORLD_SIZE
        if world != config.tensor_parallel_size:
            raise InvalidArgumentError(f"WORLD_SIZE {world} != tensor_parallel_size "
                                       f"{config.tensor_parallel_size}")
        if backend == "nccl":
            torch.cuda.set_device(envs.LOCAL_RANK or 0)
        init_distributed_environment(world, envs.RANK, backend,
                                     timeout=dist_timeout())
        initialize_model_parallel(world)
        self.dead_reason: str | None = None

    def init_workers(self, config: ResolvedConfig, profile: bool) -> None:
        pass

    def initialize_kv_cache(self, num_gpu_blocks: int) -> None:
        pass

    def broadcast_step(self, so: SchedulerOutput, grammar: GrammarOutput | None) -> None:
        pass

    def shutdown(self) -> None:
        destroy_distributed_environment()

    abort = shutdown
