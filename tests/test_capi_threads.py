"""C threads on one engine at once under AddressSanitizer, each program built with
-fsanitize=address (it loads libasan first; python itself is not instrumented):

- tests/c/threads_test.c: 8 threads submit, stream, abort, tokenize and read metrics
  (background loop). Oracle: one last event per request, token counts, equal greedy
  texts across threads, thread-local errors. Mirrors the concurrency of vLLM 0.33
  tests/v1/engine/test_async_llm.py (test_load / test_abort) at the C boundary.
- tests/c/step_threads_test.c: 4 threads step one caller-driven engine.
  Oracle: each thread gets only its requests' outputs, cumulative token counts, exactly
  one finished output per request, greedy texts equal to a single-threaded run; a thread
  that added nothing is refused with VLLM_ERR_INVALID_STATE once only other threads'
  outputs wait. Ours (vLLM's LLMEngine is single-threaded).

Both: ASan finds no error, leaks included, except what the never-finalized embedded
interpreter and its extension modules hold at exit (tests/c/lsan.supp).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.capi, pytest.mark.slow]

TESTS_C = Path(__file__).resolve().parent / "c"


@pytest.mark.parametrize("program", ["threads_test.c", "step_threads_test.c"],
                         ids=["eight-threads-streaming", "four-threads-stepping"])
def test_threads_on_one_engine_under_asan(program, compile_c, child_env, model_path):
    exe = compile_c(TESTS_C / program, "-pthread", "-g", "-fsanitize=address",
                    "-fno-omit-frame-pointer")
    env = {**child_env, "ASAN_OPTIONS": "detect_leaks=1:halt_on_error=1",
           "LSAN_OPTIONS": f"suppressions={TESTS_C / 'lsan.supp'}"}
    run = subprocess.run([str(exe), model_path], capture_output=True, text=True, env=env,
                         timeout=600)
    assert "AddressSanitizer" not in run.stderr, run.stderr[-8000:]
    assert run.returncode == 0 and run.stdout.strip() == "PASS", run.stdout + run.stderr[-4000:]
    assert "Traceback" not in run.stderr
