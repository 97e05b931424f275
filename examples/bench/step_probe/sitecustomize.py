"""Per-step probe of the engine core, in process or in the engine-core child: with this
directory on PYTHONPATH and LIBVLLM_STEP_PROBE=<path prefix> set, every process that
imports the engine times each EngineCore.step (wall, the stepping thread's CPU) and
writes <prefix>.<core|front>.<pid>.json after 64, 128, 256, ... steps and at exit: the
steps, the stepping thread's voluntary / involuntary context switches over them, the
live threads, torch's intra-op and inter-op thread counts, the CPU affinity, and the
OMP / CUDA / torch environment. The child inherits both (engine/engine_core/engine_core_utils.py
passes sys.path as PYTHONPATH and copies the environment). Summarised by
examples/bench/step_probe/summary.py; used by examples/bench/eager_modes.sh. Without
LIBVLLM_STEP_PROBE it does nothing. Being first on the path, it hides any other
sitecustomize (a distribution's, a site directory's): a bench probe only, never on the
path of a normal run.
"""

import os

_PREFIX = os.environ.get("LIBVLLM_STEP_PROBE")


def _install(prefix: str) -> None:
    import atexit
    import json
    import sys
    import threading
    import time

    import libvllm.engine.engine_core.engine_core as engine_core

    child = b"engine_core_proc" in open("/proc/self/cmdline", "rb").read()
    steps: list[tuple[float, float]] = []
    switches: list[tuple[int, int]] = []
    tid: list[int] = []
    step = engine_core.EngineCore.step

    def context_switches() -> tuple[int, int]:
        counts = {}
        with open(f"/proc/self/task/{tid[0]}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.endswith("ctxt_switches"):
                    counts[key] = int(value)
        return counts["voluntary_ctxt_switches"], counts["nonvoluntary_ctxt_switches"]

    def dump() -> None:
        import torch

        env = {k: v for k, v in os.environ.items()
               if k.startswith(("OMP", "MKL", "CUDA", "TORCH", "VLLM", "PYTHON", "LD_"))}
        with open(f"{prefix}.{'core' if child else 'front'}.{os.getpid()}.json", "w") as f:
            json.dump({"child": child, "steps": steps, "switches": [switches[0],
                       context_switches()], "threads": [t.name for t in threading.enumerate()],
                       "torch_threads": torch.get_num_threads(),
                       "interop_threads": torch.get_num_interop_threads(),
                       "affinity": sorted(os.sched_getaffinity(0)),
                       "switch_interval": sys.getswitchinterval(), "env": env}, f)

    def timed_step(self):
        if not tid:
            tid.append(threading.get_native_id())
            switches.append(context_switches())
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            return step(self)
        finally:
            steps.append((time.perf_counter() - wall, time.thread_time() - cpu))
            n = len(steps)
            if n >= 64 and n & (n - 1) == 0:  # 64, 128, 256, ...: the child may be killed
                dump()

    engine_core.EngineCore.step = timed_step
    atexit.register(lambda: steps and dump())


if _PREFIX:
    _install(_PREFIX)
