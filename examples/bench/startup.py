"""`python -m examples.bench startup`: start-up to the first token, in this process.

vllm/benchmarks/startup.py times LLM construction (weights, compile, CUDA-graph capture)
in fresh subprocesses. Ours times one fresh process (run it as its own command) in
phases, from before `import torch` to the first sampled token of a one-token request:

    Import time:        the engine modules a host imports (engine.llm_engine; with the
                        core in a child process, as on CUDA, torch is not among them)
    Engine init time:   LLMEngine.from_config (the core's process and its imports,
                        weights or dummy init, KV cache, CUDA-graph capture)
    First token time:   add_request + step() until the first token of a
                        --input-len prompt comes back
    Startup time:       the sum (what a user waits for the first token)

--output-json writes those four numbers (seconds).
"""

from __future__ import annotations

import argparse
import json
import time

from examples.bench import engine_args

PHASES = (("import_time", "Import time"), ("engine_init_time", "Engine init time"),
          ("first_token_time", "First token time"), ("total_startup_time", "Startup time"))


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-json", default=None,
                        help="Path to save the startup time results in JSON format.")
    engine_args.add_engine_args(parser)


def timed_start(args: argparse.Namespace, input_len: int = 32) -> tuple[object, dict]:
    """(engine, phase times): imports, engine construction, one request's first token."""
    t0 = time.perf_counter()
    import engine.llm_engine  # noqa: F401  (timed: the import is part of the start-up)

    t1 = time.perf_counter()
    engine = engine_args.build_engine(args)
    t2 = time.perf_counter()
    prompt = [i % engine.model_info.vocab_size for i in range(1, input_len + 1)]
    engine_args.generate(engine, [prompt], [engine_args.sampling_params(1)], "startup")
    t3 = time.perf_counter()
    return engine, {"import_time": t1 - t0, "engine_init_time": t2 - t1,
                    "first_token_time": t3 - t2, "total_startup_time": t3 - t0}


def main(args: argparse.Namespace) -> dict:
    _, results = timed_start(args, args.input_len)
    for key, name in PHASES:
        print(f"{name}: {results[key]:.2f} seconds")
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(results, f, indent=4)
    return results
