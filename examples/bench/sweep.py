"""`python -m examples.bench.sweep`: a serve sweep over max concurrencies, as `vllm bench sweep
serve`, for one fixed shape of experiment.

Mirrors vllm/benchmarks/sweep/serve.py (run_server, run_benchmark, run_comb and run_combs
with --continue-on-error: a failed point is recorded in a `.failure.json` and the sweep goes
on) and vllm/benchmarks/sweep/server.py (ServerProcess: the server in its own process group,
/health polled once a second, "Server process crashed with return code N" / "Server failed
to become ready within N seconds.", the whole group stopped at the end). The serve
parameters are the models (one server each), the bench parameters the max concurrencies:

- each model is examples/server, started once with examples/bench/serve_gpu.sh's flags: a
  config.json directory (a name under examples/bench/models/ or --model-path DIR) with
  `--load-format dummy --skip-tokenizer-init`; a .gguf file (--model-path) with its own
  weights and tokenizer. Token-id prompts either way, so no tokenizer is needed.
- each point is `python -m examples.bench serve` (examples/bench/serve.py, vLLM's bench
  client) with the random dataset, --ignore-eos, an infinite request rate and
  --max-concurrency C, its prompts max(--num-prompts, ceil(M * C)) with
  --prompts-per-concurrency-multiplier M. Each point has its own --seed (base + C): the
  server keeps prefix caching on and has no /reset_prefix_cache, so reusing a point's
  prompts would turn the next point's prefills into cache hits (vLLM resets the caches
  between runs instead).
- --budget-s: the sweep's wall-clock budget. Each model gets an equal share of what is
  left when its server starts (unused time passes to the next); a point still running at
  its model's deadline is stopped and recorded as failed, later points of that model are
  skipped. The points done are kept.

Under --out-dir (default $OUT, else `results`, vLLM's default): MODEL-concurrencyC.json per
point, vLLM's bench-serve result (its per-request lists dropped unless --save-detailed, as
vLLM's --save-result) plus run_number and the overrides (served model, max_concurrency,
num_prompts, seed), as _update_run_data; MODEL-concurrencyC.log (the client's output),
MODEL-server.log, and MODEL-concurrencyC.failure.json / MODEL-server.failure.json for what
failed (with the last lines of its log). The sweep ends by printing
examples/bench/sweep_plot.py's table of the points done; it exits 1 when any point failed
or was skipped. Plot with `python -m examples.bench.sweep_plot OUT_DIR`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import datetime
from pathlib import Path

from examples.bench.sweep_plot import markdown_table

ROOT = Path(__file__).resolve().parent.parent.parent
MODELS_DIR = ROOT / "examples" / "bench" / "models"
DETAILED_FIELDS = ("input_lens", "output_lens", "start_times", "ttfts", "itls",
                   "generated_texts", "errors", "server_queue_times", "server_ttfts")
LOG_TAIL = 20  # log lines kept in a failure record
STOP_GRACE_S = 30.0  # SIGINT, then SIGKILL for the group (examples/bench/serve_gpu.sh)


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", nargs="+", default=[],
                        help="Names of config.json directories under examples/bench/models.")
    parser.add_argument("--model-path", nargs="+", default=[],
                        help="More models: config.json directories or .gguf files.")
    parser.add_argument("--concurrency", nargs="+", type=int, required=True,
                        help="The max concurrencies of the points, in the order they run.")
    parser.add_argument("--num-prompts", type=int, default=100,
                        help="Prompts of a point (the minimum with the multiplier).")
    parser.add_argument("--prompts-per-concurrency-multiplier", type=float, default=None,
                        help="A point at concurrency C gets max(--num-prompts, ceil(M*C)).")
    parser.add_argument("--input-len", type=int, default=1024)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--budget-s", type=float, default=None,
                        help="Wall-clock budget of the whole sweep (default: none).")
    parser.add_argument("--server-flags", default="",
                        help="More examples/server flags, one shell-quoted string.")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-num-queued-reqs", type=int, default=4096)
    parser.add_argument("--lib", default=str(ROOT / "build" / "libvllm.so"))
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument("--server-ready-timeout", type=int, default=300,
                        help="Timeout in seconds to wait for the server to become ready.")
    parser.add_argument("--vocab-size", type=int, default=None,
                        help="Prompt ids are drawn below it; default: config.json's "
                             "vocab_size, else examples/bench/serve.py's default.")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save-detailed", action="store_true",
                        help="Keep the per-request lists (ttfts, itls, ...) in the JSONs.")
    parser.add_argument("-o", "--out-dir", default=os.environ.get("OUT") or "results")


def resolve_models(args: argparse.Namespace) -> list[tuple[str, Path]]:
    """(label, path) of each model: the directory name, or a .gguf file's stem."""
    models = [(name, MODELS_DIR / name) for name in args.models]
    models += [(Path(p).stem if p.endswith(".gguf") else Path(p).name, Path(p))
               for p in args.model_path]
    if not models:
        raise ValueError("Give at least one model: --models NAME or --model-path PATH.")
    for label, path in models:
        if not (path.is_file() and path.suffix == ".gguf") and not (
                path / "config.json").is_file():
            raise ValueError(f"{label}: {path} is neither a .gguf file nor a directory with "
                             "a config.json")
    return models


def prompts_for(concurrency: int, num_prompts: int, multiplier: float | None) -> int:
    return num_prompts if multiplier is None else max(num_prompts,
                                                      math.ceil(multiplier * concurrency))


def vocab_size_of(path: Path, override: int | None) -> int | None:
    if override is not None or path.is_file():
        return override
    config = json.loads((path / "config.json").read_text())
    return config.get("vocab_size") or config.get("text_config", {}).get("vocab_size")


def server_cmd(args: argparse.Namespace, label: str, path: Path) -> list[str]:
    load = [] if path.is_file() else ["--load-format", "dummy", "--skip-tokenizer-init"]
    return [sys.executable, str(ROOT / "examples" / "server" / "server.py"), str(path), *load,
            "--dtype", args.dtype, "--max-model-len", str(args.max_model_len),
            "--max-num-seqs", str(args.max_num_seqs),
            "--max-num-queued-reqs", str(args.max_num_queued_reqs), "--port", str(args.port),
            "--served-model-name", label, "--lib", args.lib,
            "--uvicorn-log-level", "warning", *shlex.split(args.server_flags)]


def bench_cmd(args: argparse.Namespace, label: str, vocab: int | None, concurrency: int,
              num_prompts: int, seed: int, output: Path) -> list[str]:
    cmd = [sys.executable, "-m", "examples.bench", "serve", "--port", str(args.port),
           "--model", label, "--dataset-name", "random", "--input-len", str(args.input_len),
           "--output-len", str(args.output_len), "--num-prompts", str(num_prompts),
           "--max-concurrency", str(concurrency), "--ignore-eos",
           "--temperature", str(args.temperature), "--seed", str(seed),
           "--percentile-metrics", "ttft,tpot,itl,e2el", "--output-json", str(output)]
    return cmd + ([] if vocab is None else ["--vocab-size", str(vocab)])


class ServerProcess:
    """examples/server in its own session (process group), as vLLM's ServerProcess."""

    def __init__(self, cmd: list[str], port: int, log: Path) -> None:
        self.cmd, self.port, self.log = cmd, port, log

    def __enter__(self) -> ServerProcess:
        with socket.socket() as probe:  # /health must not reach another server
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            try:
                probe.bind(("127.0.0.1", self.port))
            except OSError as exc:
                raise OSError(f"port {self.port} is in use: {exc}") from exc
        with self.log.open("w") as f:
            self.proc = subprocess.Popen(self.cmd, cwd=ROOT, stdout=f,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError):  # the engine core process too
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def is_server_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                return r.status == 200
        except OSError:
            return False

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"Server process crashed with return code {self.proc.returncode}")

    def wait_until_ready(self, timeout: float) -> None:
        start = time.monotonic()
        while not self.is_server_ready():
            self.check_alive()
            if time.monotonic() - start > timeout:
                raise TimeoutError(f"Server failed to become ready within {timeout:.0f} seconds.")
            time.sleep(1)


def write_failure(path: Path, exc: BaseException, log: Path, **record) -> None:
    """vLLM's failure record, plus the last lines of the log of what failed."""
    tail = log.read_text(errors="replace").splitlines()[-LOG_TAIL:] if log.exists() else []
    body = {**record, "error_type": type(exc).__name__, "error": str(exc), "log_tail": tail}
    path.write_text(json.dumps(body, indent=2) + "\n")
    print("\n".join(tail))
    print(f"[FAILED] {type(exc).__name__}: {exc}\nFailure details: {path}")


def run_point(args: argparse.Namespace, server: ServerProcess, label: str,
              vocab: int | None, concurrency: int, out_dir: Path, deadline: float) -> dict:
    """One `examples.bench serve` run; its JSON with the sweep's keys (raises on failure)."""
    num_prompts = prompts_for(concurrency, args.num_prompts,
                              args.prompts_per_concurrency_multiplier)
    seed = args.seed + concurrency
    output = out_dir / f"{label}-concurrency{concurrency}.json"
    cmd = bench_cmd(args, label, vocab, concurrency, num_prompts, seed, output)
    print(f"[BEGIN BENCHMARK] {label} max_concurrency={concurrency} num_prompts={num_prompts}")
    print(f"Benchmark command: {shlex.join(cmd)}")
    server.check_alive()
    with (out_dir / f"{label}-concurrency{concurrency}.log").open("w") as log:
        left = deadline - time.monotonic()
        subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=True,
                       timeout=None if left == math.inf else max(left, 0.0))
    run_data = json.loads(output.read_text())
    if not args.save_detailed:
        for key in DETAILED_FIELDS:
            run_data.pop(key, None)
    if run_data.get("request_rate") == math.inf:  # vLLM writes the string (strict JSON)
        run_data["request_rate"] = "inf"
    run_data |= {"date": datetime.now().strftime("%Y%m%d-%H%M%S"), "backend": "openai",
                 "endpoint_type": "openai", "run_number": 0, "served_model_name": label,
                 "max_concurrency": concurrency, "num_prompts": num_prompts, "seed": seed}
    output.write_text(json.dumps(run_data, indent=4))
    print(f"[END BENCHMARK] {output}")
    return run_data


def run_model(args: argparse.Namespace, label: str, path: Path, out_dir: Path,
              deadline: float) -> tuple[list[dict], list[str]]:
    """One server, every concurrency; (results, the points not done)."""
    done: list[dict] = []
    missed: list[str] = []
    cmd = server_cmd(args, label, path)
    print(f"[BEGIN SERVER] {label}\nServer command: {shlex.join(cmd)}")
    try:
        with ServerProcess(cmd, args.port, out_dir / f"{label}-server.log") as server:
            server.wait_until_ready(min(args.server_ready_timeout,
                                        max(deadline - time.monotonic(), 0.0)))
            vocab = vocab_size_of(path, args.vocab_size)
            for concurrency in args.concurrency:
                point = f"{label} max_concurrency={concurrency}"
                if time.monotonic() >= deadline:
                    print(f"[SKIPPED BENCHMARK] {point}: the budget is spent")
                    missed.append(f"{point}: skipped (budget)")
                    continue
                try:
                    done.append(run_point(args, server, label, vocab, concurrency, out_dir,
                                          deadline))
                except (subprocess.SubprocessError, OSError, RuntimeError, ValueError) as exc:
                    stem = f"{label}-concurrency{concurrency}"  # labels hold dots
                    write_failure(out_dir / f"{stem}.failure.json", exc,
                                  out_dir / f"{stem}.log", run_number=0,
                                  serve_overrides={"model": label},
                                  bench_overrides={"max_concurrency": concurrency})
                    missed.append(f"{point}: {type(exc).__name__}")
    except (OSError, RuntimeError, TimeoutError) as exc:
        write_failure(out_dir / f"{label}-server.failure.json", exc,
                      out_dir / f"{label}-server.log", serve_overrides={"model": label})
        missed.append(f"{label}: server {type(exc).__name__}")
    print(f"[END SERVER] {label}")
    return done, missed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m examples.bench.sweep",
        description="Run examples/bench/serve.py at several max concurrencies against "
                    "examples/server, one server a model (as vllm bench sweep serve).")
    add_cli_args(parser)
    args = parser.parse_args(argv)
    try:
        models = resolve_models(args)
    except ValueError as exc:
        parser.error(str(exc))
    if args.budget_s is not None and args.budget_s <= 0:
        parser.error("--budget-s must be positive")
    if min(args.concurrency) < 1 or args.num_prompts < 1:
        parser.error("--concurrency and --num-prompts must be at least 1")
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    end = time.monotonic() + (math.inf if args.budget_s is None else args.budget_s)
    done: list[dict] = []
    missed: list[str] = []
    for i, (label, path) in enumerate(models):
        now = time.monotonic()
        if now >= end:
            print(f"[SKIPPED SERVER] {label}: the budget is spent")
            missed.append(f"{label}: skipped (budget)")
            continue
        share = (end - now) / (len(models) - i)
        model_done, model_missed = run_model(args, label, path, out_dir, now + share)
        done += model_done
        missed += model_missed
    print(f"Sweep results saved under: {out_dir}")
    for line in missed:
        print(f"Not done: {line}")
    print(markdown_table(done))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
