"""Tune the block-FP8 Triton GEMM's launch configs on this CUDA device and write them as
vLLM's JSON files.

    python examples/bench/tune_fp8_block.py [--models llama qwen] [--batch-sizes 1 4 ...]
        [--budget-s 420] [--rounds 2] [--save-dir DIR]

Mirrors vLLM 0.33 benchmarks/kernels/benchmark_w8a8_block_fp8.py (its search space, block
shape [128, 128], fp8 inputs with random scales, the best config per batch size written as
"N={N},K={K},device_name={device},dtype=fp8_w8a8,block_shape=[128,128].json"), for the
(N, K) of examples/bench/fp8_gemm.py's models (Llama-3.1-8B, Qwen3.5-35B-A3B). Differences:
upstream times the whole product of its ranges (640 configs per batch size, hours); here a
coordinate descent over the same ranges from the better of the current config (the tuned
file, else the default) and a seed sized to M, at most --rounds rounds, so one device call
of a few minutes covers every shape; tiles taller than the batch needs and ones over the
shared memory are skipped, and each axis' candidates compile side by side
(kernels/_common.py precompile_triton). --budget-s (an equal share per shape, what one
leaves goes to the next) stops a shape's search; the batch sizes not reached keep the
existing file's configs. Times are CUDA-graph replays over enough weight
copies to miss the L2 (examples/bench/kernels.py gpu_time). Files go to --save-dir
(default kernels/configs/fp8_block/, where kernels/fp8_block_gemm.py reads them) and, with
$OUT set, to $OUT/fp8_block/ as well; a summary to $OUT/tune_fp8_block.json.
"""
# ruff: noqa: B023  (every lambda is timed inside the loop iteration that defines it)

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.bench.fp8_gemm import MODELS  # noqa: E402
from examples.bench.kernels import copies, gpu_time  # noqa: E402
from libvllm.kernels._common import next_pow2, precompile_triton  # noqa: E402
from libvllm.kernels.fp8_block_gemm import (  # noqa: E402
    CONFIG_DIR,
    get_config,
    get_config_file_name,
    get_w8a8_block_fp8_configs,
    w8a8_block_fp8_matmul,
)
from libvllm.kernels.launch_configs import GemmConfig  # noqa: E402

BLOCK = [128, 128]
# upstream's 18 sizes run past a device call here: a subset to the bench's largest
BATCH_SIZES = [1, 4, 16, 32, 64, 128, 256, 1024, 4096, 16384]
# upstream's get_configs_compute_bound ranges
SPACE = {"BLOCK_SIZE_M": [16, 32, 64, 128, 256], "BLOCK_SIZE_N": [32, 64, 128, 256],
         "BLOCK_SIZE_K": [64, 128], "GROUP_SIZE_M": [1, 16, 32, 64], "num_warps": [4, 8],
         "num_stages": [2, 3, 4, 5]}


def seed_config(m: int) -> dict[str, int]:
    """A starting point sized to M: small tiles for decode, big ones for prefill."""
    return {"BLOCK_SIZE_M": min(128, max(16, next_pow2(m))),
            "BLOCK_SIZE_N": 64 if m <= 64 else 128, "BLOCK_SIZE_K": 128,
            "GROUP_SIZE_M": 1 if m <= 256 else 16, "num_warps": 4 if m <= 128 else 8,
            "num_stages": 3}


def inputs(m: int, n: int, k: int) -> tuple:
    """Upstream's tune(): fp8 A, B over the whole range, scales rand * 1e-2; B in copies."""
    a = ((torch.rand(m, k, device="cuda") - 0.5) * 896).to(torch.float8_e4m3fn)
    bs = [((torch.rand(n, k, device="cuda") - 0.5) * 896).to(torch.float8_e4m3fn)
          for _ in range(copies(n * k))]
    a_s = torch.rand(m, -(-k // BLOCK[1]), device="cuda") * 1e-2
    b_s = torch.rand(-(-n // BLOCK[0]), -(-k // BLOCK[1]), device="cuda") * 1e-2
    return a, bs, a_s, b_s


def time_config(args: tuple, config: dict) -> float:
    """Seconds per GEMM with `config`; inf if it does not launch (shared memory, ...)."""
    a, bs, a_s, b_s = args
    try:
        cfg = GemmConfig(**config)
        return gpu_time(lambda: [w8a8_block_fp8_matmul(a, b, a_s, b_s, BLOCK, config=cfg)
                                 for b in bs]) / len(bs)
    except Exception as e:  # OutOfResources and other launch failures: not a candidate
        print(f"    skip {config}: {type(e).__name__}", flush=True)
        return float("inf")


def allowed(cfg: dict, m: int) -> bool:
    """Skip tiles taller than the batch needs and ones over the shared memory (228 KiB
    a block on sm_90: they fail to launch)."""
    stage = (cfg["BLOCK_SIZE_M"] + cfg["BLOCK_SIZE_N"]) * cfg["BLOCK_SIZE_K"]  # fp8 bytes
    return (cfg["BLOCK_SIZE_M"] <= max(16, next_pow2(m))
            and stage * cfg["num_stages"] <= 228 * 1024)


def compile_all(args: tuple, configs: list[dict]) -> None:
    """Compile the configs' variants side by side (their launches only compile)."""
    a, bs, a_s, b_s = args
    try:
        with precompile_triton():
            for cfg in configs:
                w8a8_block_fp8_matmul(a, bs[0], a_s, b_s, BLOCK, config=GemmConfig(**cfg))
    except Exception as e:  # a config that fails to compile is skipped when timed
        print(f"    compile failed in {configs}: {type(e).__name__}", flush=True)


def descend(args: tuple, m: int, start: list[dict], rounds: int) -> tuple[dict, float]:
    """Coordinate descent over SPACE from the best of `start`: along each axis in turn,
    the value with the least time, the axis' candidates compiled together first."""
    timed: dict[tuple, float] = {}

    def key(cfg: dict) -> tuple:
        return tuple(sorted(cfg.items()))

    def t(cfg: dict) -> float:
        if key(cfg) not in timed:
            timed[key(cfg)] = time_config(args, cfg)
        return timed[key(cfg)]

    compile_all(args, start)
    best = min(start, key=t)
    for _ in range(rounds):
        before = best
        for axis, values in SPACE.items():
            cands = [c for c in (dict(best, **{axis: v}) for v in values)
                     if allowed(c, m) and key(c) not in timed]
            compile_all(args, cands)
            best = min([best, *cands], key=t)
        if best == before:
            break
    return best, t(best)


def save(n: int, k: int, configs: dict[int, dict], dirs: list[Path]) -> None:
    """The file kernels/fp8_block_gemm.py get_w8a8_block_fp8_configs reads: upstream's
    name for this device, batch size -> config."""
    name = get_config_file_name(n, k, *BLOCK)
    text = json.dumps({str(m): configs[m] for m in sorted(configs)}, indent=4) + "\n"
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
        (d / name).write_text(text)
        print(f"Writing best config to {d / name}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    ap.add_argument("--batch-sizes", type=int, nargs="*", default=BATCH_SIZES)
    ap.add_argument("--budget-s", type=float, default=420.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--save-dir", default=CONFIG_DIR)
    args = ap.parse_args()
    start = time.time()
    out = os.environ.get("OUT")
    dirs = [Path(args.save_dir)] + ([Path(out) / "fp8_block"] if out else [])
    shapes = list(dict.fromkeys(s for m in args.models for s in MODELS[m].values()))
    print(f"device: {torch.cuda.get_device_name()}  shapes {shapes}", flush=True)
    summary = []
    for i, (n, k) in enumerate(shapes):
        tuned = {m: cfg.kwargs() for m, cfg in
                 (get_w8a8_block_fp8_configs(n, k, *BLOCK) or {}).items()}
        deadline = start + args.budget_s * (i + 1) / len(shapes)  # a share per shape
        for m in args.batch_sizes:
            if time.time() > deadline:
                print(f"budget spent: N={n} K={k} M={m} and after keep their configs")
                break
            io = inputs(m, n, k)
            current = get_config(m, n, k, *BLOCK).kwargs()
            t_cur = time_config(io, current)
            best, t_best = descend(io, m, [current, seed_config(m)], args.rounds)
            tuned[m] = best
            summary.append({"N": n, "K": k, "M": m, "us": t_best * 1e6,
                            "before_us": t_cur * 1e6, "config": best})
            print(f"  N={n} K={k} M={m}: {t_cur * 1e6:.1f} -> {t_best * 1e6:.1f} us {best}",
                  flush=True)
            del io
        if tuned:
            save(n, k, tuned, dirs)
        torch.cuda.empty_cache()
    if out:
        (Path(out) / "tune_fp8_block.json").write_text(json.dumps(
            {"device": torch.cuda.get_device_name(), "rows": summary}, indent=1))
    print(f"{time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
