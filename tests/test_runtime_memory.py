"""vllm_engine_free gives the engine's memory back: 10 cycles of create / one greedy
request / free in a C program (tests/c/engine_cycles.c, SmolLM2) leave the resident set
after the 10th free within 10% of the one after the first (capi/release.py: gc, CUDA's
empty_cache, malloc_trim): the layers sit in reference cycles through their parameters'
weight_loader (as in vLLM), so without a collection and a trim each cycle adds about an
engine. Oracle: /proc/self/status VmRSS. Upstream: vLLM frees with gc.collect() and
empty_cache in cleanup_dist_env_and_memory (vllm/distributed/parallel_state.py).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CYCLES = 10

pytestmark = [pytest.mark.capi, pytest.mark.slow]


def test_ten_engine_cycles_keep_the_resident_set(compile_c, model_path, child_env):
    exe = compile_c(ROOT / "tests/c/engine_cycles.c")
    run = subprocess.run([str(exe), model_path, str(CYCLES)], capture_output=True, text=True,
                         env=child_env, timeout=900)
    assert run.returncode == 0, run.stderr
    rss = [int(kb) for kb in re.findall(r"^cycle \d+ rss (\d+)$", run.stdout, re.M)]
    assert len(rss) == CYCLES, run.stdout
    assert rss[-1] <= rss[0] * 1.10, rss
