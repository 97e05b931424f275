"""vllm-cli's model-load progress (examples/cli/progress.c) from vllm_engine_create's
progress callback (engine/load_progress.py: 0, one value per tensor, then 1 once ready):

- stderr not a terminal (a pipe): plain lines "Loading model: 10%" ... "Loading model:
  100%", one per 10% step, in order, no carriage return;
- stderr a pseudo-terminal (python's pty): one line redrawn with carriage returns, like
  vLLM's tqdm bar over checkpoint shards (vllm/model_executor/model_loader/
  weight_utils.py), percents rising to a full bar at 100%, then a newline.

Oracle: the callback's contract in include/vllm.h (values in [0, 1], 1 once, last) and
the in-process GGUF load reporting per tensor (tests/test_runtime_progress.py), so the
tenths between 10% and 100% are all reached.
"""

from __future__ import annotations

import os
import pty
import re
import subprocess

import pytest

pytestmark = [pytest.mark.capi, pytest.mark.slow]

PROMPT = "The capital of France is"


def _args(built, model_path) -> list[str]:
    return [str(built / "vllm-cli"), "generate", "-m", model_path, "-p", PROMPT, "-n", "4"]


def test_piped_stderr_gets_a_line_per_ten_percent(built, model_path, child_env):
    run = subprocess.run(_args(built, model_path), capture_output=True, text=True,
                         env=child_env, timeout=300, stdin=subprocess.DEVNULL)
    assert run.returncode == 0, run.stderr
    assert "\r" not in run.stderr
    lines = [line for line in run.stderr.splitlines() if line.startswith("Loading model")]
    assert lines == [f"Loading model: {p}%" for p in range(10, 101, 10)], run.stderr
    assert run.stderr.index("Loading model: 100%") < run.stderr.index("[prompt tokens")


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def test_terminal_stderr_gets_one_bar_updated_in_place(built, model_path, child_env):
    master, slave = pty.openpty()
    proc = subprocess.Popen(_args(built, model_path), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=slave, env=child_env)
    os.close(slave)
    try:
        terminal = _read_all(master).decode("utf-8", "replace")
        out, _ = proc.communicate(timeout=300)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, terminal
    assert b"Paris" in out
    bar, newline, rest = terminal.partition("\r\n")  # the tty turns "\n" into "\r\n"
    assert newline and "[prompt tokens" in rest, terminal
    updates = bar.split("\r")
    assert updates[0] == "" and len(updates) > 3, terminal  # every draw starts with "\r"
    percents = [int(m.group(1)) for m in
                (re.fullmatch(r"Loading model: +(\d+)% \|[# ]{30}\|", u) for u in updates[1:])
                if m is not None]
    assert len(percents) == len(updates) - 1, terminal
    assert percents == sorted(set(percents)) and percents[-1] == 100
    assert updates[-1] == "Loading model: 100% |" + "#" * 30 + "|"
