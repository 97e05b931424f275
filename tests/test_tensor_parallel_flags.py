"""--tensor-parallel-size (vLLM's flag) in examples/bench/engine_args.py and
examples/server/server.py; the server maps it to a vllm_engine_params field only where
vllm.h has one, else refuses any size but 1."""

from __future__ import annotations

import argparse
import os
import sys

import pytest

from examples.bench.engine_args import add_engine_args, engine_config

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples", "server"))
import server  # noqa: E402


def test_bench_flag_sets_the_engine_field():
    p = argparse.ArgumentParser()
    add_engine_args(p)
    assert engine_config(p.parse_args(["-tp", "2"])).tensor_parallel_size == 2
    assert engine_config(p.parse_args([])).tensor_parallel_size == 1


def test_server_flag_maps_to_vllm_h_only():
    args = server.parse_args(["m.gguf", "--tensor-parallel-size", "1"])
    assert args.tensor_parallel_size == 1
    fields = server.engine_fields(args)
    assert ("tensor_parallel_size" in fields) == server.has_engine_param("tensor_parallel_size")
    if not server.has_engine_param("tensor_parallel_size"):
        with pytest.raises(SystemExit):
            server.parse_args(["m.gguf", "-tp", "2"])
