"""`python -m examples.bench startup`: cold and warm start-up to the first token, as
vllm/benchmarks/startup.py (`vllm bench startup`).

Each iteration is a fresh python process (vLLM: a spawned process), timed in phases from
before the engine's import to the first sampled token of a one-token request:

    Import time:        the engine modules a host imports (engine.llm_engine; with the
                        core in a child process, as on CUDA, torch is not among them)
    Engine init time:   LLMEngine.from_config (the core's process and its imports,
                        weights or dummy init, KV cache, CUDA-graph capture)
    First token time:   add_request + step() until the first token of a
                        --input-len prompt comes back
    Startup time:       the sum (what a user waits for the first token)

vLLM times LLM construction only, its core in process; ours keeps the engine's default
mode and the imports and first token in the total (the start-up row of docs/BENCHMARKS.md). Cold
iterations run with an empty Triton cache of their own (vLLM: a fresh VLLM_CACHE_ROOT and
inductor cache; Triton's is the compile cache this engine has), then --num-iters-warmup
iterations fill the default cache and --num-iters-warm iterations use it. Printed and
written (--output-json) with vLLM's keys: avg_<phase>_<metric>_time, <phase>_<metric>_times,
<phase>_<metric>_percentiles, for the metrics startup, import, engine_init, first_token
and cudagraph_capture.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from examples.bench import engine_args

# (iteration key, metric name in the result keys, printed name), vLLM's MetricDesc
METRICS = (("total_startup_time", "startup", "startup time"),
           ("import_time", "import", "import time"),
           ("engine_init_time", "engine_init", "engine init time"),
           ("first_token_time", "first_token", "first token time"),
           ("cudagraph_capture_time", "cudagraph_capture", "CUDA graph capture time"))
_RESULT = "STARTUP_ITERATION "  # the line an iteration's process prints its times on


def add_start_args(parser: argparse.ArgumentParser) -> None:
    """The flags of one timed start (also examples/bench/startup_phases.py's)."""
    parser.add_argument("--input-len", type=int, default=32)
    engine_args.add_engine_args(parser)


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-iters-cold", type=_count, default=3,
                        help="Number of cold startup iterations.")
    parser.add_argument("--num-iters-warmup", type=_count, default=1,
                        help="Number of warmup iterations before benchmarking warm startups.")
    parser.add_argument("--num-iters-warm", type=_count, default=3,
                        help="Number of warm startup iterations.")
    parser.add_argument("--iteration-timeout", type=float, default=1800.0,
                        help="Seconds one iteration may take before the benchmark fails.")
    parser.add_argument("--output-json", default=None,
                        help="Path to save the startup time results in JSON format.")
    add_start_args(parser)


def timed_start(args: argparse.Namespace, input_len: int = 32) -> tuple[object, dict]:
    """(engine, phase times): imports, engine construction, one request's first token."""
    t0 = time.perf_counter()
    import libvllm.engine.llm_engine  # noqa: F401  (timed: the import is part of the start-up)

    t1 = time.perf_counter()
    engine = engine_args.build_engine(args)
    t2 = time.perf_counter()
    prompt = [i % engine.model_info.vocab_size for i in range(1, input_len + 1)]
    engine_args.generate(engine, [prompt], [engine_args.sampling_params(1)], "startup")
    t3 = time.perf_counter()
    return engine, {"import_time": t1 - t0, "engine_init_time": t2 - t1,
                    "first_token_time": t3 - t2, "total_startup_time": t3 - t0,
                    "cudagraph_capture_time": engine.cudagraph_capture_time_s}


@contextlib.contextmanager
def cold_startup():
    """An empty Triton cache directory of its own for what runs inside (vLLM's
    cold_startup), removed afterwards; the previous TRITON_CACHE_DIR comes back."""
    saved = os.environ.get("TRITON_CACHE_DIR")
    cache = tempfile.mkdtemp(prefix="libvllm_startup_bench_cold_")
    try:
        os.environ["TRITON_CACHE_DIR"] = cache
        yield cache
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        if saved is None:
            os.environ.pop("TRITON_CACHE_DIR", None)
        else:
            os.environ["TRITON_CACHE_DIR"] = saved


def run_iteration(args: argparse.Namespace) -> dict:
    """One start in a fresh python process (this environment); its phase times."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    code = "from examples.bench import startup; startup.iteration_main()"
    try:
        run = subprocess.run([sys.executable, "-c", code], input=json.dumps(vars(args)),
                             capture_output=True, text=True, env=env,
                             timeout=args.iteration_timeout)
    except subprocess.TimeoutExpired as e:  # its captured output is bytes, whatever `text`
        output = b"\n".join(o for o in (e.stdout, e.stderr) if o)
        raise RuntimeError(f"startup iteration took over {args.iteration_timeout} s:\n"
                           f"{output.decode(errors='replace')}") from None
    lines = [line for line in run.stdout.splitlines() if line.startswith(_RESULT)]
    if run.returncode != 0 or not lines:
        raise RuntimeError(f"startup iteration failed (exit {run.returncode}):\n"
                           f"{run.stdout}\n{run.stderr}")
    return json.loads(lines[-1].removeprefix(_RESULT))


def iteration_main() -> None:
    """The iteration's process: flags as JSON on stdin, times on one stdout line."""
    args = argparse.Namespace(**json.load(sys.stdin))
    engine, times = timed_start(args, args.input_len)
    engine.shutdown()
    print(_RESULT + json.dumps(times), flush=True)


def summarize(phase: str, iterations: list[dict]) -> dict:
    """vLLM's result keys for every metric of one phase ("cold" / "warm")."""
    import numpy as np  # not at the top: an iteration's process times its imports

    from examples.bench.latency import PERCENTAGES

    results: dict = {}
    for key, metric, _ in METRICS:
        values = [it[key] for it in iterations]
        name = f"{phase}_{metric}"
        results[f"avg_{name}_time"] = float(np.mean(values))
        results[f"{name}_times"] = values
        results[f"{name}_percentiles"] = dict(zip(
            PERCENTAGES, np.percentile(values, PERCENTAGES).tolist(), strict=True))
    return results


def _print_phase(title: str, phase: str, results: dict) -> None:
    print(f"\n{title}:")
    for _, metric, display in METRICS:
        print(f"Avg {display}: {results[f'avg_{phase}_{metric}_time']:.2f} seconds")
    print("Startup time percentiles:")
    for pct, value in results[f"{phase}_startup_percentiles"].items():
        print(f"  {pct}%: {value:.2f} seconds")


def main(args: argparse.Namespace) -> dict:
    cold, warm = [], []
    for i in range(args.num_iters_cold):
        print(f"Cold startup iteration {i + 1}/{args.num_iters_cold}", flush=True)
        with cold_startup():
            cold.append(run_iteration(args))
    for i in range(args.num_iters_warmup):
        print(f"Warmup iteration {i + 1}/{args.num_iters_warmup}", flush=True)
        run_iteration(args)
    for i in range(args.num_iters_warm):
        print(f"Warm startup iteration {i + 1}/{args.num_iters_warm}", flush=True)
        warm.append(run_iteration(args))
    results = {**(summarize("cold", cold) if cold else {}),
               **(summarize("warm", warm) if warm else {})}
    print("\n" + "=" * 60 + "\nSTARTUP TIME BENCHMARK RESULTS\n" + "=" * 60)
    for title, phase, its in (("COLD STARTUP", "cold", cold), ("WARM STARTUP", "warm", warm)):
        if its:
            _print_phase(title, phase, results)
    print("=" * 60)
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(results, f, indent=4)
    return results
