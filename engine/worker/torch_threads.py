"""Torch's intra-op thread count while serving on CUDA, as vllm/utils/torch_utils.py
(set_torch_threads_for_runtime, called by vllm/v1/worker/gpu_worker.py after the model
loads, and by the multiproc executor's processes).

On CUDA no step's CPU work gains from torch's intra-op threads, while any parallel CPU op
in the step leaves the OpenMP workers spin-waiting after its region, on the cores the
step's serial Python (which launches every kernel of an eager step) and the engine
core's other threads need. So once the weights are loaded (loading may use the threads)
the serving process drops to 1 thread, unless the user chose a count: OMP_NUM_THREADS in
the environment (vLLM's rule) or vllm.h's n_threads (EngineConfig.n_threads). The CPU
device keeps its threads: there they run the forward pass.
"""

from __future__ import annotations

import logging

import torch

from libvllm.engine import envs

logger = logging.getLogger(__name__)


def set_torch_threads_for_runtime(n_threads: int = 0) -> None:
    """1 torch thread from now on, unless n_threads or OMP_NUM_THREADS chose a count."""
    if n_threads:
        return
    omp = envs.OMP_NUM_THREADS
    if omp is not None:
        if omp.strip().isdigit() and int(omp) > 1:  # vLLM's warning
            logger.warning("OMP_NUM_THREADS=%s is set; leaving Torch threads at %d for "
                           "serving. Multi-threaded torch CPU ops during serving can degrade "
                           "performance through spin-wait contention.", omp,
                           torch.get_num_threads())
        return
    if torch.get_num_threads() != 1:
        logger.info("Reducing Torch threads from %d to 1 for serving. Set OMP_NUM_THREADS "
                    "in the external environment to override.", torch.get_num_threads())
        torch.set_num_threads(1)
