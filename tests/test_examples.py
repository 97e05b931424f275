"""The examples the README shows are built and run as a user would run them.

examples/c/simple.c: greedy completion of a prompt on the default model; the
oracle for its text is our own engine through Python (same greedy tokens).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.capi


def test_simple_c_example_streams_the_greedy_completion(compile_c, child_env, model_path):
    exe = compile_c(ROOT / "examples/c/simple.c")
    run = subprocess.run([str(exe), model_path, "The capital of France is"],
                         capture_output=True, text=True, env=child_env, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "Paris" in run.stdout
    assert "Traceback" not in run.stderr


def test_simple_c_example_reports_a_missing_model(compile_c, child_env, tmp_path):
    exe = compile_c(ROOT / "examples/c/simple.c")
    run = subprocess.run([str(exe), str(tmp_path / "nope.gguf"), "hi"],
                         capture_output=True, text=True, env=child_env, timeout=300)
    assert run.returncode == 1
    assert run.stderr.startswith("create: model path does not exist")
