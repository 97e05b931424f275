"""Every variant of the KV-cache kernels (fp8 and bf16 caches) compiles for sm_90 without a
GPU (tests/kv_fp8_compile_check.py): the interpreter tests on CPU run no compiler, and the
fp8 paths' Triton typing rules (one return type per jit helper, no dtype change of a value
across a runtime branch) are only checked by a compile. On CUDA the GPU tests compile them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(torch.cuda.is_available(), reason="on CUDA the kernel tests compile them")
def test_every_kv_cache_kernel_variant_compiles_for_sm90() -> None:
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests")])
    run = subprocess.run(
        [sys.executable, "-c", "import kv_fp8_compile_check as c; print(c.compile_all())"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split()[-1] == "34"
