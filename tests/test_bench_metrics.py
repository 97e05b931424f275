"""The benchmark metrics as vLLM defines them: serve's TTFT/TPOT/ITL/E2EL, throughputs,
goodput, peaks and result block (vllm/benchmarks/serve.py calculate_metrics, benchmark),
arrival times (get_request), latency's summary (vllm/benchmarks/latency.py)."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from examples.bench.latency import latency_summary
from examples.bench.serve import arrival_times, parse_goodput
from examples.bench.serve_metrics import (
    RequestFuncOutput,
    calculate_metrics,
    format_result,
    peak_output_and_concurrency,
)


def _out(start, ttft, itl, tokens, prompt_len=10, success=True):
    return RequestFuncOutput(success=success, prompt_len=prompt_len, output_tokens=tokens,
                             ttft=ttft, itl=list(itl), latency=ttft + sum(itl),
                             start_time=start)


def test_tpot_itl_ttft_e2el_definitions():
    a = _out(0.0, 0.1, [0.02, 0.04, 0.03], 4)  # latency 0.19
    b = _out(0.0, 0.3, [0.05], 2)  # latency 0.35
    m = calculate_metrics([a, b], 2.0, [99])
    tpot_a, tpot_b = (0.19 - 0.1) / 3, (0.35 - 0.3) / 1
    assert m["mean_tpot_ms"] == pytest.approx(1000 * (tpot_a + tpot_b) / 2)
    assert m["mean_ttft_ms"] == pytest.approx(200.0)
    assert m["median_itl_ms"] == pytest.approx(1000 * np.median([0.02, 0.04, 0.03, 0.05]))
    assert m["mean_e2el_ms"] == pytest.approx(1000 * (0.19 + 0.35) / 2)
    assert m["std_ttft_ms"] == pytest.approx(100.0)  # population std
    assert m["total_output_tokens"] == 6 and m["total_input_tokens"] == 20
    assert m["request_throughput"] == pytest.approx(1.0)
    assert m["output_throughput"] == pytest.approx(3.0)
    assert m["total_token_throughput"] == pytest.approx(13.0)


def test_one_token_requests_have_no_tpot_and_missing_usage_counts_one():
    m = calculate_metrics([_out(0, 0.5, [], 1), _out(0, 0.5, [], 0)], 1.0, [50])
    assert m["mean_tpot_ms"] == 0.0 and m["p50_tpot_ms"] == 0.0  # empty list -> [0]
    assert m["total_output_tokens"] == 2


def test_failed_requests_are_counted_not_measured():
    m = calculate_metrics([_out(0, 0.1, [0.1], 2), _out(0, 9.0, [], 0, success=False)],
                          1.0, [99])
    assert (m["completed"], m["failed"]) == (1, 1)
    assert m["mean_ttft_ms"] == pytest.approx(100.0)


def test_percentiles_are_numpy_linear():
    outs = [_out(0, (i + 1) / 1000, [], 1) for i in range(100)]  # TTFT 1..100 ms
    m = calculate_metrics(outs, 1.0, [99, 99.9, 50])
    assert m["p99_ttft_ms"] == pytest.approx(99.01)
    assert m["p99.9_ttft_ms"] == pytest.approx(99.901)
    assert m["p50_ttft_ms"] == pytest.approx(50.5) == pytest.approx(m["median_ttft_ms"])


def test_goodput_needs_every_slo():
    outs = [_out(0, 0.1, [0.01], 2), _out(0, 0.1, [0.5], 2), _out(0, 0.9, [0.01], 2)]
    m = calculate_metrics(outs, 2.0, [99], parse_goodput(["ttft:200", "tpot:100"]))
    assert m["request_goodput"] == pytest.approx(0.5)  # only the first meets both
    assert calculate_metrics(outs, 2.0, [99])["request_goodput"] is None


def test_parse_goodput_rejects_bad_pairs():
    with pytest.raises(argparse.ArgumentTypeError):
        parse_goodput(["itl:5"])
    with pytest.raises(argparse.ArgumentTypeError):
        parse_goodput(["ttft:-1"])


def test_peak_tokens_and_concurrency():
    a = _out(0.0, 0.1, [0.1, 0.1], 3)  # tokens at 0.1 0.2 0.3, alive [0, 0.3)
    b = _out(0.2, 0.1, [1.0], 2)  # tokens at 0.3 1.3, alive [0.2, 1.3)
    c = _out(2.0, 0.1, [], 1)  # alone later
    peak_tokens, peak_conc = peak_output_and_concurrency([a, b, c])
    assert peak_tokens == 4 and peak_conc == 2


def test_result_block_has_vllms_lines():
    m = calculate_metrics([_out(0, 0.1, [0.02], 2)], 1.0, [99])
    text = format_result(m, 4, 2.0, ["ttft", "tpot", "itl"], [99], False)
    lines = text.splitlines()
    assert lines[0] == "============ Serving Benchmark Result ============"
    assert lines[-1] == "=" * 50
    assert "Maximum request concurrency:             4         " in lines
    assert "Request rate configured (RPS):           2.00      " in lines
    assert "Mean TTFT (ms):                          100.00    " in lines
    assert "P99 TPOT (ms):                           20.00     " in lines
    assert "-----Time per Output Token (excl. 1st token)------" in lines
    assert not any("E2EL" in line or "goodput" in line for line in lines)
    mg = calculate_metrics([_out(0, 0.1, [0.02], 2)], 1.0, [99], {"ttft": 50.0})
    inf_text = format_result(mg, None, float("inf"), ["e2el"], [99], True)
    assert "Request rate configured" not in inf_text and "Mean E2EL (ms):" in inf_text
    assert "Request goodput (req/s):                 0.00      " in inf_text


def test_arrival_times():
    rng = np.random.default_rng(0)
    assert arrival_times(5, float("inf"), 1.0, rng) == [0.0] * 5
    t = arrival_times(200, 10.0, 1.0, rng)
    assert t[-1] == pytest.approx(20.0) and all(np.diff(t) >= 0)  # rescaled to N / rate
    assert np.diff(arrival_times(5, 2.0, float("inf"), rng)) == pytest.approx([0.5] * 4)
    gaps = np.diff(arrival_times(4000, 1.0, 1.0, np.random.default_rng(1)))
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(1.0, abs=0.1)  # exponential: cv 1
    smooth = np.diff(arrival_times(4000, 1.0, 4.0, np.random.default_rng(1)))
    assert np.std(smooth) / np.mean(smooth) == pytest.approx(0.5, abs=0.1)  # gamma k=4
    with pytest.raises(ValueError):
        arrival_times(3, 1.0, 0.0, rng)


def test_latency_summary_is_vllms():
    s = latency_summary([1.0, 2.0, 3.0, 4.0])
    assert s["avg_latency"] == 2.5 and s["std_latency"] == pytest.approx(np.std([1, 2, 3, 4]))
    assert list(s["percentiles"]) == [10, 25, 50, 75, 90, 99]
    assert s["percentiles"][10] == pytest.approx(1.3) and s["percentiles"][99] == pytest.approx(
        3.97)
