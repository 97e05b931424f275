"""4 C threads step one caller-driven engine at once under AddressSanitizer (issue 15,
item 3): tests/c/step_threads_test.c built with -fsanitize=address.

Oracle: the program's own checks (each thread gets only its requests' outputs, cumulative
token counts, exactly one finished output per request, greedy texts equal to a
single-threaded run; a thread that added nothing is refused with VLLM_ERR_INVALID_STATE
once only other threads' outputs wait) and ASan finding no error, leaks included, except
what the never-finalized embedded interpreter holds (tests/c/lsan.supp). The executable
is ASan-instrumented, so libasan loads first; python itself is not instrumented (no
LD_PRELOAD needed). Ours (vLLM's LLMEngine is single-threaded).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.capi, pytest.mark.slow]

TESTS_C = Path(__file__).resolve().parent / "c"


def test_four_threads_step_one_engine_under_asan(compile_c, child_env, model_path):
    exe = compile_c(TESTS_C / "step_threads_test.c", "-pthread", "-g", "-fsanitize=address",
                    "-fno-omit-frame-pointer")
    env = {**child_env, "ASAN_OPTIONS": "detect_leaks=1:halt_on_error=1",
           "LSAN_OPTIONS": f"suppressions={TESTS_C / 'lsan.supp'}"}
    run = subprocess.run([str(exe), model_path], capture_output=True, text=True, env=env,
                         timeout=600)
    assert "AddressSanitizer" not in run.stderr, run.stderr[-8000:]
    assert run.returncode == 0 and run.stdout.strip() == "PASS", run.stdout + run.stderr[-4000:]
    assert "Traceback" not in run.stderr
