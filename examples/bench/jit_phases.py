"""`python examples/bench/jit_phases.py RUNS [throughput flags]`: Triton JIT compiles by phase.

One in-process engine (the engine core in this process, so Triton's hooks see its
compiles; VLLM_ENABLE_V1_MULTIPROCESSING=0), then `examples.bench throughput` runs on it,
RUNS = comma-separated `prompts:seed` (a new seed gives new random prompts, so no run
hits another's prefix cache). After start-up and after each run it prints

    JIT <phase>: <n> compiles <s>s: <kernel> <count>/<s>s, ...

from triton.knobs.runtime's jit_cache_hook / jit_post_compile_hook: a kernel's seconds run
from the first request of each variant to its compile's end, so for a compile on a thread
pool (kernels/_common.py precompile_triton, finished at the end of its pass) they are not
its compile time; the count is exact. A compile inside a timed run is time the throughput
figure pays. It found the GGUF offline
drop with it (docs/BENCHMARKS.md). With JIT_KEYS=FILE every compile's phase, kernel and
Triton cache key (its argument specialization: types, 16-byte divisibility, constexprs)
is appended to FILE, to tell a run's new variant from the start-up's. Example, the
GGUF offline workload:

    python examples/bench/jit_phases.py 1000:0 --skip-tokenizer-init --max-model-len 2048 \\
        --dataset-name random --input-len 1024 --output-len 128 --model /tmp/q4.gguf
"""

from __future__ import annotations

import collections
import copy
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import triton  # noqa: E402

from examples.bench import engine_args, throughput  # noqa: E402
from examples.bench.__main__ import build_parser  # noqa: E402

_events: list[tuple[str, float, str]] = []  # (kernel, seconds, key) since the last report
_started: dict[tuple, float] = {}


def _pre(**kw) -> None:
    _started.setdefault(kw["key"], time.perf_counter())


def _post(**kw) -> None:
    start = _started.pop(kw["key"], None)
    _events.append((kw["fn"].name.split(".")[-1],
                    0.0 if start is None else time.perf_counter() - start, str(kw["key"])))


def report(phase: str) -> None:
    by = collections.defaultdict(lambda: [0, 0.0])
    for name, seconds, _ in _events:
        by[name][0] += 1
        by[name][1] += seconds
    if os.environ.get("JIT_KEYS"):
        with open(os.environ["JIT_KEYS"], "a") as f:
            f.writelines(f"{phase}\t{name}\t{key}\n" for name, _, key in _events)
    kernels = sorted(by.items(), key=lambda item: -item[1][1])
    print(f"JIT {phase}: {len(_events)} compiles {sum(s for _, s, _ in _events):.1f}s: "
          + ", ".join(f"{k} {n}/{s:.1f}s" for k, (n, s) in kernels), flush=True)
    _events.clear()


def main(argv: list[str]) -> None:
    runs = [tuple(map(int, run.split(":"))) for run in argv[0].split(",")]
    args = build_parser().parse_args(["throughput", *argv[1:]])
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    triton.knobs.runtime.jit_cache_hook = _pre
    triton.knobs.runtime.jit_post_compile_hook = _post
    start = time.perf_counter()
    engine = engine_args.build_engine(args)
    print(f"JIT start-up took {time.perf_counter() - start:.1f}s", flush=True)
    report("start-up")
    for prompts, seed in runs:
        run_args = copy.copy(args)
        run_args.num_prompts, run_args.seed = prompts, seed
        throughput.run(engine, run_args)
        report(f"run {prompts}:{seed}")


if __name__ == "__main__":
    main(sys.argv[1:])
