"""`python -m examples.bench <throughput|latency|serve|startup> [flags]`, as `vllm bench`.

Run from the repository root (PYTHONPATH=. when the package is not installed). The
subcommands and their flags mirror vllm/entrypoints/cli/benchmark/ and
vllm/benchmarks/{throughput,latency,serve,startup}.py; `--help` on each lists them.
examples/bench/suite.py runs the fixed GPU suite on top of these.
"""

from __future__ import annotations

import argparse
import importlib

SUBCOMMANDS = {
    "throughput": "Benchmark offline inference throughput.",
    "latency": "Benchmark the latency of processing a single batch of requests.",
    "serve": "Benchmark online serving throughput against an OpenAI server.",
    "startup": "Benchmark the start-up time to the first token.",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m examples.bench")
    sub = parser.add_subparsers(dest="bench_type", required=True)
    for name, help_text in SUBCOMMANDS.items():
        module = importlib.import_module(f"examples.bench.{name}")
        module.add_cli_args(sub.add_parser(name, help=help_text, description=help_text))
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    return importlib.import_module(f"examples.bench.{args.bench_type}").main(args)


if __name__ == "__main__":
    main()
