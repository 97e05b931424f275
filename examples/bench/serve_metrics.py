"""Serving metrics and vLLM's result block, as vllm/benchmarks/serve.py.

Definitions (calculate_metrics, async_request_openai_completions of
vllm/benchmarks/lib/endpoint_request_func.py):
- TTFT: request sent -> first SSE chunk that has `choices`.
- ITL: the gaps between successive chunks with `choices` (one list over all requests).
- TPOT per request: (latency - TTFT) / (output_tokens - 1), only when output_tokens > 1.
- E2EL: request sent -> last chunk with `choices`.
- output tokens: usage.completion_tokens (stream_options.include_usage), else 1.
- mean / median / std (population) / np.percentile (linear) of each, in ms; an empty list
  counts as [0], as vLLM's `np.mean(x or 0)`.
- request throughput = completed / duration; output throughput = sum(output_tokens) /
  duration; goodput = requests meeting every SLO of --goodput / duration.
- Peak output token throughput: the most tokens in any one-second bucket from the first
  request's start; peak concurrent requests: a sweep over [start, start + latency).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

METRIC_HEADERS = {"ttft": ("TTFT", "Time to First Token"),
                  "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
                  "itl": ("ITL", "Inter-token Latency"),
                  "e2el": ("E2EL", "End-to-end Latency")}


@dataclass
class RequestFuncOutput:
    success: bool = False
    prompt_len: int = 0
    output_tokens: int = 0
    ttft: float = 0.0  # seconds
    itl: list[float] = field(default_factory=list)  # seconds
    latency: float = 0.0  # seconds
    start_time: float = 0.0  # perf_counter when sent
    generated_text: str = ""
    error: str = ""


def _stats(name: str, values: list[float], percentiles: list[float]) -> dict:
    v = values or 0
    out = {f"mean_{name}_ms": float(np.mean(v)) * 1000,
           f"median_{name}_ms": float(np.median(v)) * 1000,
           f"std_{name}_ms": float(np.std(v)) * 1000}
    for p in percentiles:
        out[f"p{_p_word(p)}_{name}_ms"] = float(np.percentile(v, p)) * 1000
    return out


def _p_word(p: float) -> str:
    return str(int(p)) if int(p) == p else str(p)


def peak_output_and_concurrency(outputs: list[RequestFuncOutput]) -> tuple[float, int]:
    ok = [o for o in outputs if o.success]
    if not ok:
        return 0.0, 0
    t0 = min(o.start_time for o in ok)
    t1 = max(o.start_time + o.latency for o in ok)
    buckets = np.zeros(int(np.ceil(t1 - t0)) + 1)
    for o in ok:
        t = o.start_time + o.ttft
        times = [t]
        for gap in o.itl:
            t += gap
            times.append(t)
        for tt in times:
            b = int(tt - t0)
            if 0 <= b < len(buckets):
                buckets[b] += 1
    events = sorted([(o.start_time, 1) for o in ok] + [(o.start_time + o.latency, -1)
                                                         for o in ok])
    peak = cur = 0
    for _, delta in events:
        cur += delta
        peak = max(peak, cur)
    return float(buckets.max()), peak


def calculate_metrics(outputs: list[RequestFuncOutput], dur_s: float,
                      selected_percentiles: list[float],
                      goodput: dict[str, float] | None = None) -> dict:
    """vLLM's BenchmarkMetrics as a flat dict of its JSON keys."""
    ok = [o for o in outputs if o.success]
    output_lens = [o.output_tokens or 1 for o in ok]
    ttfts = [o.ttft for o in ok]
    e2els = [o.latency for o in ok]
    itls = [gap for o in ok for gap in o.itl]
    all_tpots = [(o.latency - o.ttft) / (n - 1) if n > 1 else 0.0
                 for o, n in zip(ok, output_lens)]
    tpots = [t for t, n in zip(all_tpots, output_lens) if n > 1]
    good = 0
    if goodput:
        series = {"ttft": ttfts, "tpot": all_tpots, "e2el": e2els}
        for i in range(len(ok)):
            if all(series[k][i] <= slo_ms / 1000 for k, slo_ms in goodput.items()):
                good += 1
    total_input = sum(o.prompt_len for o in ok)
    total_output = sum(output_lens)
    peak_tok_s, peak_conc = peak_output_and_concurrency(outputs)
    result = {"duration": dur_s, "completed": len(ok), "failed": len(outputs) - len(ok),
              "total_input_tokens": total_input, "total_output_tokens": total_output,
              "request_throughput": len(ok) / dur_s,
              "request_goodput": good / dur_s if goodput else None,
              "output_throughput": total_output / dur_s,
              "total_token_throughput": (total_input + total_output) / dur_s,
              "max_output_tokens_per_s": peak_tok_s, "max_concurrent_requests": peak_conc}
    for name, values in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        result |= _stats(name, values, selected_percentiles)
    return result


def format_result(m: dict, max_concurrency: int | None, request_rate: float,
                  percentile_metrics: list[str], selected_percentiles: list[float],
                  goodput: bool) -> str:
    """vLLM's "Serving Benchmark Result" block (its labels, widths and order)."""
    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="=")]

    def row(label: str, value, fmt: str = "{:<10}") -> None:
        lines.append(f"{label:<40} " + fmt.format(value))

    f2 = "{:<10.2f}"
    row("Successful requests:", m["completed"])
    row("Failed requests:", m["failed"])
    if max_concurrency is not None:
        row("Maximum request concurrency:", max_concurrency)
    if request_rate != float("inf"):
        row("Request rate configured (RPS):", request_rate, f2)
    row("Benchmark duration (s):", m["duration"], f2)
    row("Total input tokens:", m["total_input_tokens"])
    row("Total generated tokens:", m["total_output_tokens"])
    row("Request throughput (req/s):", m["request_throughput"], f2)
    if goodput:
        row("Request goodput (req/s):", m["request_goodput"], f2)
    row("Output token throughput (tok/s):", m["output_throughput"], f2)
    row("Peak output token throughput (tok/s):", m["max_output_tokens_per_s"], f2)
    row("Peak concurrent requests:", m["max_concurrent_requests"], f2)
    row("Total token throughput (tok/s):", m["total_token_throughput"], f2)
    for key in ("ttft", "tpot", "itl", "e2el"):
        if key not in percentile_metrics:
            continue
        name, header = METRIC_HEADERS[key]
        lines.append("{s:{c}^{n}}".format(s=header, n=50, c="-"))
        row(f"Mean {name} (ms):", m[f"mean_{key}_ms"], f2)
        row(f"Median {name} (ms):", m[f"median_{key}_ms"], f2)
        for p in selected_percentiles:
            row(f"P{_p_word(p)} {name} (ms):", m[f"p{_p_word(p)}_{key}_ms"], f2)
    lines.append("=" * 50)
    return "\n".join(lines)
