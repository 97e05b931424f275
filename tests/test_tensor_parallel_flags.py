"""--tensor-parallel-size (vLLM's flag; and --quantization, --kv-cache-dtype) in
examples/bench/engine_args.py and
examples/server/server.py; the server maps it to a vllm_engine_params field only where
vllm.h has one, else refuses any size but 1."""

from __future__ import annotations

import argparse
import os
import sys

from examples.bench.engine_args import add_engine_args, engine_config

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples", "server"))
import server  # noqa: E402


def test_bench_flag_sets_the_engine_field():
    p = argparse.ArgumentParser()
    add_engine_args(p)
    assert engine_config(p.parse_args(["-tp", "2"])).tensor_parallel_size == 2
    assert engine_config(p.parse_args([])).tensor_parallel_size == 1


def test_server_flag_sets_the_vllm_h_field():
    args = server.parse_args(["m.gguf", "--tensor-parallel-size", "2"])
    assert server.engine_fields(args)["tensor_parallel_size"] == 2
    assert "tensor_parallel_size" not in server.engine_fields(server.parse_args(["m.gguf"]))


def test_bench_quantization_and_cache_dtype_flags_set_the_engine_fields():
    """vLLM's --quantization / --kv-cache-dtype / --mamba-ssm-cache-dtype reach EngineConfig;
    left out, the engine's defaults stay."""
    p = argparse.ArgumentParser()
    add_engine_args(p)
    cfg = engine_config(p.parse_args(["-q", "fp8", "--kv-cache-dtype", "fp8",
                                      "--mamba-ssm-cache-dtype", "float32"]))
    assert (cfg.quantization, cfg.kv_cache_dtype, cfg.mamba_ssm_cache_dtype) == \
        ("fp8", "fp8", "float32")
    default = engine_config(p.parse_args([]))
    assert (default.quantization, default.kv_cache_dtype, default.mamba_ssm_cache_dtype) == \
        (None, "auto", "auto")
