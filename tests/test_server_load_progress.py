"""examples/server logs the model load at start-up, one plain line per 10%
(examples/server/load_progress_log.py, wired to vllm_engine_create's progress callback):
"loading model: 10%" ... "loading model: 100%", in order, before "model ... ready".

Oracle: the callback's contract in include/vllm.h (values in [0, 1], 1 once, last) and
the in-process GGUF load reporting per tensor (tests/test_runtime_progress.py), so every
tenth is reached. vLLM's `vllm serve` shows a tqdm bar over checkpoint shards
(vllm/model_executor/model_loader/weight_utils.py); a server log gets lines.
"""

from __future__ import annotations

import ctypes
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "examples" / "server"


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_load_progress_log_logs_each_tenth_once(monkeypatch):
    monkeypatch.syspath_prepend(str(SERVER))
    from load_progress_log import LoadProgressLog

    logger = logging.getLogger("test.load_progress_log")
    logger.setLevel(logging.INFO)
    logger.addHandler(handler := _Lines())
    log = LoadProgressLog(logger)
    # what the C float gives for 0.9 (0.89999998) is 90%
    for fraction in (0.0, 0.05, 0.1, 0.15, 0.35, 0.85, ctypes.c_float(0.9).value, 0.9, 1.0):
        log(fraction)
    assert handler.lines == [f"loading model: {p}%" for p in (10, 30, 80, 90, 100)]


@pytest.mark.capi
@pytest.mark.slow
def test_server_logs_a_line_per_ten_percent_at_start_up(built, model_path, child_env,
                                                         tmp_path):
    pytest.importorskip("uvicorn")
    from tests.test_server import _free_port, serving

    port = _free_port()
    log = (tmp_path / "server.log").open("w+")
    proc = subprocess.Popen(
        [sys.executable, str(SERVER / "server.py"), model_path, "--port", str(port),
         "--max-model-len", "512", "--lib", str(built / "libvllm.so"),
         "--uvicorn-log-level", "warning"],
        stdout=log, stderr=subprocess.STDOUT, env=child_env)
    for _ in serving(proc, port, log):
        pass  # healthy, then stopped
    log.seek(0)
    text = log.read()
    lines = re.findall(r"^INFO vllm\.server: (loading model: \d+%)$", text, re.M)
    assert lines == [f"loading model: {p}%" for p in range(10, 101, 10)], text
    assert text.index("loading model: 100%") < text.index("ready in"), text
