"""MultiprocExecutor: tensor parallelism with one process per rank, as
vllm/v1/executor/multiproc_executor.py.

Rank 0 runs in the engine core's own process (vLLM's driver worker): it joins the process
group, loads its shard and drives its ModelRunner as the engine core always did. Ranks
1..tp-1 are worker processes (`python -m libvllm.engine.executor.multiproc_worker`, started with the
environment's python as the engine-core child is, engine/engine_core/engine_core_utils.py) that
mirror its start-up and run every step on the scheduler output rank 0 broadcasts
(engine/executor/messages.py); rank 0's sampled tokens are the step's output. Rendezvous:
each engine's own tcp://127.0.0.1:<free port> (vLLM's distributed_init_method), passed to
its workers, so no engine meets another's store; rank 0 refuses to start while this process
already has a torch.distributed default group (its workers could never join that one).
Worker death (vLLM's monitor_workers): a monitor thread logs it, records the reason and
calls the failure callback (vLLM's register_failure_callback); rank 0's next collective
normally fails (gloo/nccl: the peer is gone) and the step raises, which the engine-core child
turns into its DEAD path: every stream gets an error event. A collective can also wait for
the dead peer until its timeout (gloo, seen once on a loaded CI machine), which is what the
engine-core child's callback covers (engine/engine_core/engine_core_proc.py end_if_stuck).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import torch.distributed as dist

from libvllm.engine import envs
from libvllm.engine.config import EngineConfig
from libvllm.engine.core.sched_output import GrammarOutput, SchedulerOutput
from libvllm.engine.distributed.parallel_state import (
    destroy_distributed_environment,
    init_distributed_environment,
    initialize_model_parallel,
)
from libvllm.engine.errors import VllmError
from libvllm.engine.executor import messages
from libvllm.engine.process_utils import describe_exit, python_executable
from libvllm.engine.resolved_config import ResolvedConfig

logger = logging.getLogger(__name__)
_MONITOR_POLL_S = 0.2


def dist_timeout() -> timedelta:
    return timedelta(seconds=envs.LIBVLLM_DIST_TIMEOUT_S)


def get_open_port() -> int:
    """A free TCP port on 127.0.0.1 (vllm/utils get_open_port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_distributed_init_method(ip: str, port: int) -> str:
    """vllm/utils/network_utils.py get_distributed_init_method."""
    return f"tcp://{ip}:{port}"


class MultiprocExecutor:
    def __init__(self, config: EngineConfig, backend: str) -> None:
        self.world_size = config.tensor_parallel_size
        self.dead_reason: str | None = None
        self.failure_callback: Callable[[str], None] | None = None
        self._closing = False
        self.workers: list[subprocess.Popen] = []
        if dist.is_initialized():
            raise VllmError("tensor_parallel_size > 1 starts its own torch.distributed "
                            "process group, and this process already has one: destroy it "
                            "first (torch.distributed.destroy_process_group()) or use "
                            "distributed_executor_backend='external_launcher'")
        self.init_method = get_distributed_init_method("127.0.0.1", get_open_port())
        env = envs.child_environment()
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        # the user's intent (the workers load no tokenizer); the resolved config follows
        # in WorkerInit
        cfg = json.dumps({**dataclasses.asdict(config), "skip_tokenizer_init": True})
        for rank in range(1, self.world_size):
            argv = [python_executable(), "-m", "libvllm.engine.executor.multiproc_worker",
                    "--rank", str(rank), "--backend", backend, "--parent-pid",
                    str(os.getpid()), "--distributed-init-method", self.init_method,
                    "--config", cfg]
            self.workers.append(subprocess.Popen(
                argv, env=env, stdin=subprocess.DEVNULL, start_new_session=True,
                close_fds=True))
        threading.Thread(target=self._monitor_workers, name="vllm-tp-monitor",
                         daemon=True).start()
        try:
            self._rendezvous(backend)
            initialize_model_parallel(self.world_size)
        except BaseException:
            self.abort()
            raise

    def _rendezvous(self, backend: str) -> None:
        """Join the group; a worker that exits first (it could not start) fails this at
        once instead of after the rendezvous timeout."""
        done: list[BaseException | None] = []

        def join() -> None:
            try:
                init_distributed_environment(self.world_size, 0, backend, self.init_method,
                                             timeout=dist_timeout())
                done.append(None)
            except BaseException as e:  # noqa: BLE001 - re-raised by the caller
                done.append(e)

        thread = threading.Thread(target=join, name="vllm-tp-rendezvous", daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(_MONITOR_POLL_S)
            if thread.is_alive() and self.dead_reason is not None:
                raise VllmError(f"tensor parallel start-up failed: {self.dead_reason}")
        if done[0] is not None:
            raise done[0]

    def _monitor_workers(self) -> None:
        """Poll the workers; one exiting outside shutdown is the engine's death."""
        while not self._closing:
            for p in self.workers:
                code = p.poll()
                if code is not None and not self._closing:
                    self.dead_reason = f"tensor-parallel worker pid {p.pid} died " \
                                       f"({describe_exit(code)})"
                    logger.error("%s", self.dead_reason)
                    self._kill_workers()  # the others' next collective would fail anyway
                    if self.failure_callback is not None:
                        self.failure_callback(self.dead_reason)
                    return
            time.sleep(_MONITOR_POLL_S)

    def register_failure_callback(self, callback: Callable[[str], None]) -> None:
        """callback(reason) runs on the monitor thread when a worker dies."""
        self.failure_callback = callback

    # ------------------------------------------------------------- start-up and steps

    def init_workers(self, config: ResolvedConfig, profile: bool) -> None:
        messages.send(messages.WorkerInit(config, profile))

    def initialize_kv_cache(self, num_gpu_blocks: int) -> None:
        messages.send(num_gpu_blocks)

    def broadcast_step(self, so: SchedulerOutput, grammar: GrammarOutput | None) -> None:
        """Every worker runs this step (rank 0 runs it next, in the caller)."""
        if self.dead_reason is not None:
            raise VllmError(self.dead_reason)
        messages.send(messages.StepMessage(so, grammar))

    def shutdown(self) -> None:
        if self._closing:
            return
        self._closing = True
        try:
            if self.dead_reason is None:
                messages.send(messages.StepMessage(None))
            for p in self.workers:
                p.wait(timeout=30)
        except Exception:  # noqa: BLE001 - a worker that cannot stop is killed
            logger.warning("a tensor-parallel worker did not stop; killing it")
        finally:
            self._kill_workers()
            destroy_distributed_environment()

    def abort(self) -> None:
        """Start-up failed on rank 0: stop the workers without a message."""
        self._closing = True
        self._kill_workers()
        destroy_distributed_environment()

    def _kill_workers(self) -> None:
        for p in self.workers:
            if p.poll() is None:
                p.kill()
