"""The suite's Qwen3-30B-A3B step: latency at batch 1, 8 and 32
and the random throughput run, and the table rows that put the throughput beside the
Llama-8B figure of the same run (target >= 1.3x) with vLLM's published figure unratioed.
CPU only: the table from hand-made results."""

from __future__ import annotations

import re

from examples.bench import suite


def test_qwen3_30b_step_runs_batches_and_throughput():
    model, extra, batches = suite.STEPS["qwen3-30b-a3b"]
    assert model == "qwen3-30b-a3b" and extra == [] and batches == [1, 8, 32]
    assert "qwen3-30b-a3b" in suite.RANDOM_THROUGHPUT_STEPS
    assert "qwen3-30b-a3b" in suite.DEFAULT_STEPS


def test_table_puts_the_moe_throughput_beside_llamas():
    res = {"llama8b-graphs": {"throughput": {"num_requests": 1000, "requests_per_second": 30.0,
                                             "output_tokens_per_second": 3840.0}},
           "qwen3-30b-a3b": {"latency_b8": {"avg_latency": 1.25,
                                            "decode_tokens_per_second": 900.0},
                             "throughput": {"num_requests": 1000, "requests_per_second": 39.0,
                                            "output_tokens_per_second": 4992.0}}}
    table = suite.table(res, {})
    assert re.search(r"Qwen3-30B-A3B latency bs 8 \(32 in, 128 out\) +\| 1\.250 s", table)
    assert "decode 900.0 tok/s" in table
    assert "39.00 req/s" in table and "1.30x Llama-8B's" in table and ">= 1.3x Llama-8B" in table
    assert "TPOT 13.18 ms (A9)" in table
    pending = suite.table({}, {"qwen3-30b-a3b": "PENDING: suite time budget spent"})
    assert "PENDING req/s" in pending and "PENDING: suite time budget spent" in pending
