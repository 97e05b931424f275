"""A tensor-parallel worker process (ranks 1..tp-1), as vllm/v1/executor/multiproc_executor.py
WorkerProc: join the process group, load this rank's shard, mirror the engine core's
start-up (ModelRunner, optional CUDA profile pass, KV cache with this rank's kv heads, CUDA
graphs), then run every step rank 0 broadcasts until the shutdown message. Its sampled
tokens are discarded (rank 0's are the output; all ranks sample from the same gathered
logits with the same seeds). Exits when its parent (the engine core) does.

`python -m libvllm.engine.executor.multiproc_worker --rank R --backend gloo|nccl --parent-pid P
--distributed-init-method tcp://HOST:PORT --config JSON` (world size: the config's
tensor_parallel_size).
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time

import torch

from libvllm.engine import envs
from libvllm.engine.config import EngineConfig
from libvllm.engine.distributed.parallel_state import (
    destroy_distributed_environment,
    init_distributed_environment,
    initialize_model_parallel,
)
from libvllm.engine.executor import messages
from libvllm.engine.executor.kv_heads import kv_cache_shape
from libvllm.engine.executor.multiproc_executor import dist_timeout
from libvllm.engine.layers.kv_scales import configure_kv_cache
from libvllm.engine.worker.gpu_worker import determine_available_memory
from libvllm.engine.worker.model_load import load_model_and_tokenizer
from libvllm.engine.worker.model_runner import ModelRunner
from libvllm.engine.worker.torch_threads import set_torch_threads_for_runtime


def run_worker(config: EngineConfig, rank: int, backend: str, init_method: str) -> None:
    """config: the user's intent, as the executor sent it (no tokenizer); the sizes and
    modes come resolved from rank 0 (WorkerInit)."""
    tp = config.tensor_parallel_size
    if backend == "nccl":  # one GPU per rank on this host (LOCAL_RANK when launched)
        torch.cuda.set_device(envs.LOCAL_RANK if envs.LOCAL_RANK is not None else rank)
    init_distributed_environment(tp, rank, backend, init_method, timeout=dist_timeout())
    initialize_model_parallel(tp)
    if config.n_threads:
        torch.set_num_threads(config.n_threads)
    model, arch, _, device, dtype = load_model_and_tokenizer(config)
    if device.type == "cuda":
        set_torch_threads_for_runtime(config.n_threads)
    init = messages.recv(messages.WorkerInit)
    sched, cache = init.config.scheduler, init.config.cache
    runner = ModelRunner(model, None, device, cache.block_size,
                         max_num_reqs=sched.max_num_seqs,
                         max_num_tokens=sched.max_num_batched_tokens,
                         max_model_len=sched.max_model_len)
    if init.profile:
        determine_available_memory(runner, sched.max_num_batched_tokens,
                                   cache.gpu_memory_utilization,
                                   init.config.compilation.capture_sizes())
    num_blocks = messages.recv(int)
    shape = kv_cache_shape(arch, num_blocks, cache.block_size, tp)
    kv_dtype = configure_kv_cache(model, cache.kv_cache_dtype, cache.calculate_kv_scales,
                                  dtype)  # engine/layers/kv_scales.py
    runner.initialize_kv_cache([torch.zeros(shape, dtype=kv_dtype, device=device)  # as rank 0
                                for _ in range(arch.num_hidden_layers)])
    runner.capture_model(init.config.compilation.capture_sizes())
    torch.manual_seed(init.config.seed)  # the draws of rank 0's sampler, step after step
    while (msg := messages.recv(messages.StepMessage)).scheduler_output is not None:
        runner.execute_model(msg.scheduler_output, msg.grammar_output)
    destroy_distributed_environment()


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(0.5)
    os._exit(1)  # the engine core is gone


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="a libvllm tensor-parallel worker")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    p.add_argument("--parent-pid", type=int, required=True)
    p.add_argument("--distributed-init-method", required=True,
                   help="rank 0's rendezvous, tcp://HOST:PORT")
    p.add_argument("--config", required=True, help="EngineConfig as JSON")
    args = p.parse_args(argv)
    threading.Thread(target=_watch_parent, args=(args.parent_pid,), daemon=True).start()
    run_worker(EngineConfig(**json.loads(args.config)), args.rank, args.backend,
               args.distributed_init_method)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
