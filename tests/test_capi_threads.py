"""8 C threads on one engine at once (submit, stream, abort, tokenize, metrics) under
AddressSanitizer: tests/c/threads_test.c built with -fsanitize=address.

Oracle: the program's own checks (one last event per request, token counts, equal
greedy texts across threads, thread-local errors) and ASan finding no error, leaks
included, except what the never-finalized embedded interpreter and its extension
modules hold at exit (tests/c/lsan.supp). Mirrors the concurrency of vLLM 0.33
tests/v1/engine/test_async_llm.py (test_load / test_abort) at the C boundary.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.capi, pytest.mark.slow]

TESTS_C = Path(__file__).resolve().parent / "c"


def test_eight_threads_on_one_engine_under_asan(compile_c, child_env, model_path):
    exe = compile_c(TESTS_C / "threads_test.c", "-pthread", "-g", "-fsanitize=address",
                    "-fno-omit-frame-pointer")
    env = {**child_env, "ASAN_OPTIONS": "detect_leaks=1:halt_on_error=1",
           "LSAN_OPTIONS": f"suppressions={TESTS_C / 'lsan.supp'}"}
    run = subprocess.run([str(exe), model_path], capture_output=True, text=True, env=env,
                         timeout=600)
    assert "AddressSanitizer" not in run.stderr, run.stderr[-8000:]
    assert run.returncode == 0 and run.stdout.strip() == "PASS", run.stdout + run.stderr[-4000:]
    assert "Traceback" not in run.stderr
