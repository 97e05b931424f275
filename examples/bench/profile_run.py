"""Where a whole workload's time goes on CUDA: a closed-loop run (as `serve` with
--max-concurrency) or an open one (as `throughput`), steps and GPU kernels summarised.

    PYTHONPATH=. python -m examples.bench.profile_run --model examples/bench/models/llama-3.1-8b \
        --load-format dummy --skip-tokenizer-init --dtype bfloat16 --max-model-len 2048 \
        --num-prompts 300 --input-len 1024 --output-len 128 --max-concurrency 64 --profile

--max-concurrency C keeps C requests in flight and adds the next one as one finishes (the
load `vllm bench serve --max-concurrency` puts on a server, without HTTP); 0 adds every
request at once (`throughput`). Prints requests/s, and, in process
(--no-multiprocessing), the scheduled tokens and wall time of every step grouped by step
size, so mixed prefill/decode steps show apart from pure decode ones. --profile runs the
timed pass under torch.profiler (CUDA activity) and adds GPU busy time, idle gaps and
kernel time by family (GEMM, attention, other). Writes profile_run-c<C>.json to --out.
The purpose of vLLM's `--profile` flags, summarised as a table.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from examples.bench import engine_args
from examples.bench.profile_step import kernel_spans

_FAMILIES = (("attention", ("paged_attention",)),
             ("gemm", ("gemm", "nvjet", "cutlass", "sm90", "gemv", "cublas")))
_BUCKETS = (1, 64, 256, 512, 1024, 2048, 4096, 8192, 1 << 30)


def family(name: str) -> str:
    low = name.lower()
    return next((fam for fam, keys in _FAMILIES if any(k in low for k in keys)), "other")


def record_steps(scheduler) -> tuple[list[int], list[int]]:
    """Scheduled tokens and running requests of every step, appended as the in-process
    scheduler plans it."""
    tokens: list[int] = []
    running: list[int] = []
    schedule = scheduler.schedule

    def recording_schedule(*a, **kw):
        out = schedule(*a, **kw)
        tokens.append(out.total_num_scheduled_tokens)
        running.append(len(scheduler.running))
        return out

    scheduler.schedule = recording_schedule
    return tokens, running


def closed_loop(engine, prompts: list[list[int]], params, concurrency: int, tag: str
                ) -> list[float]:
    """Runs every prompt with at most `concurrency` in flight (0: all at once); the wall
    time of every engine.step() call."""
    pending = list(enumerate(prompts))[::-1]
    limit = concurrency or len(prompts)
    in_flight, walls = 0, []
    while pending or in_flight:
        while pending and in_flight < limit:
            i, prompt = pending.pop()
            engine.add_request(f"{tag}{i}", prompt, params)
            in_flight += 1
        start = time.perf_counter()
        outs = engine.step()
        walls.append(time.perf_counter() - start)
        in_flight -= sum(o.finished for o in outs)
    return walls


def step_table(tokens: list[int], walls: list[float]) -> list[dict]:
    """Steps grouped by scheduled tokens (async scheduling: a step() call returns the
    previous step's outputs, so walls pair with the step planned one call earlier)."""
    groups: dict[int, list[float]] = defaultdict(list)
    for n, wall in zip(tokens, walls[1:]):
        groups[next(b for b in _BUCKETS if n <= b)].append(wall)
    return [{"tokens_le": b, "steps": len(w), "ms_mean": 1e3 * float(np.mean(w)),
             "ms_total": 1e3 * sum(w)} for b, w in sorted(groups.items())]


def kernel_table(spans, wall_s: float) -> dict:
    busy = sum(e - s for _, s, e in spans)
    per_fam: dict[str, float] = defaultdict(float)
    per_kernel: dict[str, float] = defaultdict(float)
    for name, s, e in spans:
        per_fam[family(name)] += e - s
        per_kernel[name] += e - s
    top = sorted(per_kernel.items(), key=lambda kv: -kv[1])[:15]
    return {"wall_ms": 1e3 * wall_s, "gpu_busy_ms": busy / 1e3,
            "families_ms": {k: v / 1e3 for k, v in per_fam.items()},
            "top_kernels_ms": [(n[:100], t / 1e3) for n, t in top]}


def run(engine, args: argparse.Namespace) -> dict:
    import torch

    engine_args.check_max_model_len(engine, args.input_len + args.output_len)
    params = engine_args.sampling_params(args.output_len, 1.0)
    rng = np.random.default_rng(0)
    warm = max(args.max_concurrency, 8)  # own prompts: no prefix-cache hits in the run
    prompts = rng.integers(10000, size=(args.num_prompts + warm, args.input_len)).tolist()
    closed_loop(engine, prompts[args.num_prompts:], params, args.max_concurrency, "warm-")
    prompts = prompts[: args.num_prompts]
    scheduler = None if engine.is_multiprocess else engine.engine_core.engine_core.scheduler
    tokens, running = record_steps(scheduler) if scheduler is not None else ([], [])
    preempted = scheduler.num_preemptions if scheduler is not None else 0  # the warm-up's
    prof = None
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        prof = profile(activities=[ProfilerActivity.CUDA])
        prof.__enter__()
    start = time.perf_counter()
    walls = closed_loop(engine, prompts, params, args.max_concurrency, "run-")
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    res = {"requests_per_second": args.num_prompts / wall, "wall_s": wall,
           "steps": len(walls), "step_table": step_table(tokens, walls)}
    if scheduler is not None:  # how full the batch ran and what preemption cost
        res.update(num_preemptions=scheduler.num_preemptions - preempted,
                   num_gpu_blocks=scheduler.kv_cache_manager.block_pool.num_gpu_blocks,
                   max_running=max(running, default=0))
    if prof is not None:
        prof.__exit__(None, None, None)
        res["kernels"] = kernel_table(kernel_spans(prof), wall)
    print(json.dumps(res, indent=1))
    return res


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m examples.bench.profile_run")
    parser.add_argument("--num-prompts", type=int, default=300)
    parser.add_argument("--input-len", type=int, default=1024)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--max-concurrency", type=int, default=64)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    engine_args.add_engine_args(parser)
    args = parser.parse_args(argv)
    res = run(engine_args.build_engine(args), args)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    mode = "mp" if args.multiprocessing else "inproc"
    name = f"profile_run-c{args.max_concurrency}-{mode}{'-prof' if args.profile else ''}.json"
    (Path(args.out) / name).write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
