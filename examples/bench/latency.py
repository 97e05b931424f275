"""`python -m examples.bench latency`: the latency of one batch, as `vllm bench latency`.

Mirrors vllm/benchmarks/latency.py: --batch-size prompts of --input-len random token ids
(numpy's legacy global RNG, ids < 10000), each generating exactly --output-len tokens
(temperature 1.0, top_p 1.0, ignore_eos), run to completion --num-iters-warmup times,
then timed --num-iters times. Prefix caching is off by default, as vLLM sets it (the
same prompts every iteration would otherwise hit the cache). Prints vLLM's lines

    Avg latency: X seconds
    Std latency: X seconds
    10% percentile latency: X seconds   (and 25, 50, 75, 90, 99)

and ours after them: the decode throughput excluding the first step (the step that runs
the prefill and samples the first tokens), batch * (output_len - 1) / (latency - first
step), averaged over the iterations; only when batch * input_len fits one step's token
budget (max_num_batched_tokens), else null. --output-json writes vLLM's keys plus ours.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from examples.bench import engine_args

PERCENTAGES = [10, 25, 50, 75, 90, 99]


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--num-iters-warmup", type=int, default=10,
                        help="Number of iterations to run for warmup.")
    parser.add_argument("--num-iters", type=int, default=30,
                        help="Number of iterations to run.")
    engine_args.add_run_args(parser, "latency")
    engine_args.add_engine_args(parser)
    parser.set_defaults(enable_prefix_caching=False)


def latency_summary(latencies: list[float]) -> dict:
    """vLLM's result keys: mean, population std, the raw list, np.percentile at
    10/25/50/75/90/99 (linear interpolation)."""
    arr = np.array(latencies)
    return {"avg_latency": float(np.mean(arr)), "std_latency": float(np.std(arr)),
            "latencies": arr.tolist(),
            "percentiles": dict(zip(PERCENTAGES, np.percentile(arr, PERCENTAGES).tolist()))}


def run(engine, args: argparse.Namespace) -> dict:
    engine_args.check_max_model_len(engine, args.input_len + args.output_len)
    params = engine_args.sampling_params(args.output_len, 1.0, n=args.n,
                                         detokenize=not args.disable_detokenize)
    prompts = np.random.randint(10000, size=(args.batch_size, args.input_len)).tolist()

    def run_to_completion(it: int) -> tuple[float, float]:
        start = time.perf_counter()
        _, first_step = engine_args.generate(engine, prompts, [params] * len(prompts),
                                             f"lat{it}-")
        return time.perf_counter() - start, first_step

    print("Warming up...")
    for i in range(args.num_iters_warmup):
        run_to_completion(-1 - i)
    runs = [run_to_completion(i) for i in range(args.num_iters)]
    results = latency_summary([lat for lat, _ in runs])
    print(f"Avg latency: {results['avg_latency']} seconds")
    print(f"Std latency: {results['std_latency']} seconds")
    for percentage, percentile in results["percentiles"].items():
        print(f"{percentage}% percentile latency: {percentile} seconds")
    decode_tokens = args.batch_size * args.n * (args.output_len - 1)
    # the first step samples every first token only when all prompts fit in it
    one_step = args.batch_size * args.input_len <= engine.resolved.scheduler.max_num_batched_tokens
    rates = [decode_tokens / (lat - first) for lat, first in runs if lat > first] \
        if one_step else []
    results["decode_tokens_per_second"] = float(np.mean(rates)) if rates else None
    results["first_step_seconds"] = float(np.mean([first for _, first in runs]))
    if rates:
        print(f"Avg decode throughput (excl. 1st step): "
              f"{results['decode_tokens_per_second']:.2f} tokens/s")
    print(f"Avg first step (prefill + 1st token): {results['first_step_seconds']} seconds")
    results["peak_gpu_memory_gib"] = engine_args.peak_memory_line(engine)[1]
    return results


def main(args: argparse.Namespace) -> dict:
    return engine_args.run_and_save(run, args)
