"""examples/server's vllm.h 1.3 flags (`vllm serve`'s --quantization/-q, --kv-cache-dtype,
--calculate-kv-scales, --mamba-cache-dtype, --mamba-ssm-cache-dtype, --mamba-cache-mode):
argparse -> engine_fields -> the ctypes EngineParams of examples/server/libvllm_ctypes.py -> the
library's EngineConfig. Oracle: the engine's own messages for invalid values (each field
reaches its own EngineConfig field) and a healthy engine for valid ones, on a tiny Llama
config directory with dummy weights (tests/test_dummy_loader.py)."""

from __future__ import annotations

import os
import sys

import pytest
from test_dummy_loader import write_config

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples", "server"))
import server  # noqa: E402
from libvllm_ctypes import LibVLLM, VllmError  # noqa: E402

FLAGS = ["-q", "fp8", "--kv-cache-dtype", "fp8_e4m3", "--calculate-kv-scales",
         "--mamba-cache-dtype", "float32", "--mamba-ssm-cache-dtype", "bfloat16",
         "--mamba-cache-mode", "align"]


def test_flags_map_into_the_engine_fields():
    fields = server.engine_fields(server.parse_args(["m.gguf", *FLAGS]))
    assert {k: fields[k] for k in ("quantization", "kv_cache_dtype", "calculate_kv_scales",
                                   "mamba_cache_dtype", "mamba_ssm_cache_dtype",
                                   "mamba_cache_mode")} == {
        "quantization": "fp8", "kv_cache_dtype": "fp8_e4m3", "calculate_kv_scales": True,
        "mamba_cache_dtype": "float32", "mamba_ssm_cache_dtype": "bfloat16",
        "mamba_cache_mode": "align"}
    assert server.parse_args(["m", "--quantization", "compressed-tensors"]).quantization == \
        "compressed-tensors"


def test_unset_flags_keep_the_librarys_defaults():
    fields = server.engine_fields(server.parse_args(["m.gguf"]))
    for name in ("quantization", "kv_cache_dtype", "calculate_kv_scales", "mamba_cache_dtype",
                 "mamba_ssm_cache_dtype", "mamba_cache_mode"):
        assert fields[name] is None, name


@pytest.mark.capi
@pytest.mark.parametrize("flags, message", [
    (["-q", "awq"], "Unknown quantization method: 'awq'"),
    (["--kv-cache-dtype", "fp8_e5m2"], "Invalid kv_cache_dtype: 'fp8_e5m2'"),
    (["--mamba-cache-dtype", "fp8"], "mamba_cache_dtype must be one of"),
    (["--mamba-ssm-cache-dtype", "fp8"], "mamba_ssm_cache_dtype must be one of"),
    (["--mamba-cache-mode", "all"], "mamba_cache_mode must be none or align"),
    (["--mamba-cache-mode", "none", "--calculate-kv-scales"], None),
], ids=["quantization", "kv-cache-dtype", "mamba-cache-dtype", "mamba-ssm-cache-dtype",
        "mamba-cache-mode", "valid"])
def test_flags_reach_the_library(built, tmp_path, flags, message):
    path = write_config(tmp_path, "LlamaForCausalLM")
    args = server.parse_args([path, "--load-format", "dummy", "--skip-tokenizer-init",
                              "--device", "cpu", "--max-model-len", "256", *flags])
    lib = LibVLLM(str(built / "libvllm.so"))
    try:
        if message is None:
            lib.create_engine(path, **server.engine_fields(args))
            lib.check_health()
        else:
            with pytest.raises(VllmError, match=message):
                lib.create_engine(path, **server.engine_fields(args))
    finally:
        lib.free_engine()
