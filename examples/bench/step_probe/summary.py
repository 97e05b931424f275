"""Summary of examples/bench/step_probe files: per file (one process that stepped the
engine core), the median step wall and stepping-thread CPU time over the last 1000 steps,
the context switches of the stepping thread per step, and its settings.

    python3 examples/bench/step_probe/summary.py FILE.json ...
"""

import json
import statistics
import sys


def main(paths: list[str]) -> None:
    for path in paths:
        with open(path) as f:
            d = json.load(f)
        last = d["steps"][-1000:]
        n = len(d["steps"])
        (v0, n0), (v1, n1) = d["switches"]
        print(f"{path}: {'child' if d['child'] else 'in process'}, {n} steps, step wall "
              f"median {1e3 * statistics.median(s[0] for s in last):.3f} ms, CPU median "
              f"{1e3 * statistics.median(s[1] for s in last):.3f} ms; context switches a "
              f"step {(v1 - v0) / n:.2f} voluntary, {(n1 - n0) / n:.2f} involuntary; torch "
              f"threads {d['torch_threads']}/{d['interop_threads']}, {len(d['affinity'])} "
              f"CPUs, threads {d['threads']}, env {d['env']}")


if __name__ == "__main__":
    main(sys.argv[1:])
