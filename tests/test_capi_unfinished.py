"""vllm_engine_num_unfinished as include/vllm.h states it: a request is unfinished until
its last output has been delivered (background loop, push mode: its last callback has
returned; pull mode: its last event was taken by vllm_request_next).

tests/c/unfinished_push_test.c: many rounds of push requests whose last callback sleeps
a little; the host polls num_unfinished down to 0 and then finds every last callback
returned. Oracle: the header's sentence (the loop used to drop a request from the count
before handing its last output to the callback). Ours: vLLM's AsyncLLM has no such
counter at the C boundary (its get_num_unfinished_requests is LLMEngine's).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.capi, pytest.mark.slow]

TESTS_C = Path(__file__).resolve().parent / "c"


def test_num_unfinished_counts_push_requests_until_their_last_callback_returned(
        compile_c, child_env, model_path):
    exe = compile_c(TESTS_C / "unfinished_push_test.c")
    run = subprocess.run([str(exe), model_path], capture_output=True, text=True,
                         env=child_env, timeout=600)
    assert run.returncode == 0 and run.stdout.strip() == "PASS", run.stdout + run.stderr[-4000:]
    assert "Traceback" not in run.stderr
