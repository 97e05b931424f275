"""Runs tests/c/exit_with_loop.c COUNT times: a C program that returns from main while
the background loop runs, with no vllm_shutdown. Prints one line per run and a summary;
exits 1 when any run crashed (a signal) or failed.

    .venv/bin/python tests/exit_with_loop.py 50 [--model PATH] [--lib-dir build]

tests/test_runtime_exit.py runs it 10 times; 50 is the count for the record.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = Path.home() / ".cache/libvllm/models/SmolLM2-135M-Instruct.Q4_1.gguf"


def build(lib_dir: Path, out: Path) -> Path:
    subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", f"-I{ROOT / 'include'}",
                    str(ROOT / "tests/c/exit_with_loop.c"), "-o", str(out), f"-L{lib_dir}",
                    "-lvllm", f"-Wl,-rpath,{lib_dir}"], check=True)
    return out


def run(exe: Path, model: Path, count: int) -> list[int]:
    """The exit status of each run (negative: the signal that ended it)."""
    statuses = []
    for i in range(count):
        proc = subprocess.run([str(exe), str(model)], capture_output=True, text=True,
                              timeout=300, env={k: v for k, v in os.environ.items()
                                                if k != "PYTHONUNBUFFERED"})
        code = proc.returncode
        what = f"signal {signal.Signals(-code).name}" if code < 0 else f"status {code}"
        print(f"run {i + 1}/{count}: {what}" + (f": {proc.stderr.strip()[-300:]}" if code
                                                 else ""), flush=True)
        statuses.append(code)
    return statuses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("count", type=int)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--lib-dir", type=Path, default=ROOT / "build")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        statuses = run(build(args.lib_dir.resolve(), Path(work) / "exit_with_loop"),
                       args.model, args.count)
    crashes = sum(code < 0 for code in statuses)
    failures = sum(code > 0 for code in statuses)
    print(f"{args.count} runs: {crashes} crashed, {failures} failed")
    sys.exit(1 if crashes or failures else 0)


if __name__ == "__main__":
    main()
