"""`python examples/bench/startup_phases.py [--graph-warmups N] [start flags]`: where the
start-up to the first token goes, in process (the engine core in this process, so the
timers and Triton's hooks see it; VLLM_ENABLE_V1_MULTIPROCESSING=0).

Runs one timed start of `examples.bench startup` (examples/bench/startup.py timed_start)
in this process, with timers around the engine core's phases, and prints one line

    STARTUP {"engine_init_time": ..., "load": ..., "profile": ..., "precompile_profile": ...,
             "capture_model": ..., "precompile_capture": ..., "compiles": {...}, ...}

load: from the start of engine construction to the engine core's (weights or dummy init);
profile: engine/worker/gpu_worker.py determine_available_memory, of which
precompile_profile its compile-only passes; capture_model: the graph capture, of which
precompile_capture its compile-only pass (kernels/_common.py precompile_triton);
compiles: Triton's requests for a variant it had not in memory (jit_cache_hook), "pool"
from a compile-only pass, "waited" from a launch that compiled before it ran (one at a
time). Run it with an empty TRITON_CACHE_DIR for a cold start. --graph-warmups sets
engine/worker/cudagraph.py's eager runs before each capture (A/B; default: the tree's).
It showed that Triton 3.6 hashed a kernel's source on every compile-only
launch of a pending variant (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import triton  # noqa: E402

import libvllm.engine.engine_core.engine_core as engine_core  # noqa: E402
import libvllm.engine.worker.cudagraph as cudagraph  # noqa: E402
import libvllm.engine.worker.gpu_worker as gpu_worker  # noqa: E402
from examples.bench import startup  # noqa: E402
from libvllm.engine.worker.model_runner import ModelRunner  # noqa: E402

phases: dict[str, float] = {}
compiles = {"pool": 0, "waited": 0}


def _count(**kw) -> None:
    compiles["pool" if kw.get("is_manual_warmup") else "waited"] += 1


def _timed(name: str, fn):
    def inner(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            phases[name] = phases.get(name, 0.0) + time.perf_counter() - start
    return inner


def _timed_context(name: str, cm):
    @contextlib.contextmanager
    def inner(*args, **kwargs):
        start = time.perf_counter()
        try:
            with cm(*args, **kwargs):
                yield
        finally:
            phases[name] = phases.get(name, 0.0) + time.perf_counter() - start
    return inner


def main(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--graph-warmups", type=int, default=None)
    startup.add_start_args(parser)
    args = parser.parse_args(argv)
    phases.clear()
    compiles.update(pool=0, waited=0)
    begin = time.perf_counter()
    patches = [(triton.knobs.runtime, "jit_cache_hook", _count),
               (cudagraph, "precompile_triton",
                _timed_context("precompile_capture", cudagraph.precompile_triton)),
               (gpu_worker, "precompile_triton",
                _timed_context("precompile_profile", gpu_worker.precompile_triton)),
               (engine_core, "determine_available_memory",
                _timed("profile", engine_core.determine_available_memory)),
               (ModelRunner, "capture_model", _timed("capture_model", ModelRunner.capture_model))]
    init = engine_core.EngineCore.__init__

    def core_init(self, *a, **kw):
        phases["load"] = time.perf_counter() - begin
        return init(self, *a, **kw)

    patches.append((engine_core.EngineCore, "__init__", core_init))
    if args.graph_warmups is not None:
        patches.append((cudagraph, "_WARMUP_RUNS", args.graph_warmups))
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    multiprocessing = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    try:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        for obj, name, value in patches:
            setattr(obj, name, value)
        _, result = startup.timed_start(args, args.input_len)
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)
        if multiprocessing is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING")
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = multiprocessing
    result = {k: round(v, 2) for k, v in {**result, **phases}.items()}
    result["compiles"] = dict(compiles)
    print("STARTUP", json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
