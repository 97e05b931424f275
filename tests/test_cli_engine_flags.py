"""build/vllm-cli's vllm.h 1.3 engine flags, named as `vllm serve`'s: -q/--quantization,
--kv-cache-dtype, --calculate-kv-scales (no value), --mamba-cache-dtype,
--mamba-ssm-cache-dtype, --mamba-cache-mode. Oracle: the engine's messages for invalid
values (each flag lands in its own vllm_engine_params field, whose EngineConfig check
names it) and a normal answer with valid ones on the test model."""

from __future__ import annotations

import re
import subprocess

import pytest

pytestmark = pytest.mark.capi

NEW_FLAGS = ["-q", "--quantization", "--kv-cache-dtype", "--calculate-kv-scales",
             "--mamba-cache-dtype", "--mamba-ssm-cache-dtype", "--mamba-cache-mode"]


@pytest.fixture(scope="module")
def cli(built, child_env):
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(built / "vllm-cli"), *args], capture_output=True, text=True,
                              env=child_env, timeout=300)

    return run


def test_help_lists_the_engine_flags(cli):
    run = cli("--help")
    assert run.returncode == 0
    for flag in NEW_FLAGS:
        assert re.search(rf"(^|[\s,]){re.escape(flag)}([\s,=]|$)", run.stdout, re.M), flag


@pytest.mark.parametrize("args, message", [
    (["-q", "awq"], "Unknown quantization method: 'awq'"),
    (["--quantization=gptq"], "Unknown quantization method: 'gptq'"),
    (["--kv-cache-dtype", "fp8_e5m2"], "Invalid kv_cache_dtype: 'fp8_e5m2'"),
    (["--mamba-cache-dtype", "fp8"], "mamba_cache_dtype must be one of"),
    (["--mamba-ssm-cache-dtype", "int8"], "mamba_ssm_cache_dtype must be one of"),
    (["--mamba-cache-mode=all"], "mamba_cache_mode must be none or align, got 'all'"),
])
def test_each_engine_flag_reaches_its_field(cli, tmp_path, args, message):
    run = cli("chat", "-m", str(tmp_path / "absent.gguf"), "-p", "Hi", *args)
    assert run.returncode == 1, run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("vllm-cli: error: ") and message in last


def test_calculate_kv_scales_takes_no_value(cli):
    run = cli("chat", "-m", "x", "--calculate-kv-scales=1")
    assert run.returncode == 2 and "takes no value: --calculate-kv-scales=1" in run.stderr


@pytest.mark.slow
def test_valid_engine_flags_answer(cli, model_path):
    run = cli("generate", "-m", model_path, "-p", "The capital of France is", "-n", "4",
              "--temp", "0", "--kv-cache-dtype", "auto", "--mamba-cache-mode", "none",
              "--mamba-cache-dtype", "float32", "--calculate-kv-scales")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() and "completion tokens: 4" in run.stderr
