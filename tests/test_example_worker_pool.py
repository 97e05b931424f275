"""examples/c/worker_pool.c, built and run as a user would: a pool of threads drives one
engine in both ways include/vllm.h documents ("Thread safety"):

- loop: 2 threads submit (pull mode) and hand the handles to 3 threads that pull them;
  the background loop is the one stepping thread;
- step: 3 threads each add their own requests and step (vllm_engine_step returns the
  outputs of the calling thread's requests; the example fails if a step returns another
  thread's request).

Oracle: examples/c/simple.c's greedy 32-token text for the same prompt (single thread,
caller-driven); every one of the 6 greedy requests prints it, finished, and
vllm_engine_num_unfinished reads 0 once every thread is done. Ours (vLLM's LLMEngine is
driven by one thread).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.capi, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "The capital of France is"


def _run(cmd, env) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env,
                          timeout=600)


@pytest.fixture(scope="module")
def greedy_text(compile_c, child_env, model_path) -> str:
    run = _run([compile_c(ROOT / "examples/c/simple.c"), model_path, PROMPT], child_env)
    assert run.returncode == 0, run.stderr
    return run.stdout[:-1]


@pytest.mark.parametrize("mode", ["loop", "step"])
def test_worker_pool_example_prints_every_request(mode, compile_c, child_env, model_path,
                                                  greedy_text):
    exe = compile_c(ROOT / "examples/c/worker_pool.c", "-pthread")
    run = _run([exe, model_path, PROMPT, mode], child_env)
    assert run.returncode == 0, run.stdout + run.stderr[-4000:]
    assert "Traceback" not in run.stderr
    body, sep, tail = run.stdout.rpartition("unfinished=")
    assert sep and tail == "0\n", run.stdout
    parts = re.split(r"^\[pool-(\d)\] finish=(\w+) tokens=(\d+)\n", body, flags=re.M)
    assert parts[0] == ""
    heads = [parts[i:i + 4] for i in range(1, len(parts), 4)]
    assert [int(h[0]) for h in heads] == list(range(6)), run.stdout
    for _, reason, tokens, text in heads:
        assert reason in ("stop", "length") and 0 < int(tokens) <= 32
        assert text[:-1] == greedy_text


def test_worker_pool_example_rejects_an_unknown_mode(compile_c, child_env, model_path):
    exe = compile_c(ROOT / "examples/c/worker_pool.c", "-pthread")
    run = _run([exe, model_path, PROMPT, "threads"], child_env)
    assert run.returncode == 2 and run.stderr.startswith("usage:")
