"""A C program that returns from main while the background loop runs, without
vllm_shutdown, exits with status 0 every time (capi/at_exit.py): 10 runs of
tests/c/exit_with_loop.c through tests/exit_with_loop.py. Without the exit handler some
runs end with SIGSEGV (torch's static destructors while the loop thread is inside a
step); `tests/exit_with_loop.py 50` counts them. Ours (vLLM ships no C library).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.capi, pytest.mark.slow]


def test_exit_with_the_loop_running_never_crashes(built, model_path):
    run = subprocess.run([sys.executable, str(ROOT / "tests/exit_with_loop.py"), "10",
                          "--model", model_path, "--lib-dir", str(built)],
                         capture_output=True, text=True, timeout=900)
    assert run.stdout.strip().endswith("10 runs: 0 crashed, 0 failed"), run.stdout + run.stderr
    assert run.returncode == 0
