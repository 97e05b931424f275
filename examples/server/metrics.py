"""Prometheus text exposition of the engine's metrics, under vLLM's metric names.

Mirrors vllm/v1/metrics/loggers.py (PrometheusStatLogger): gauges and counters labelled
model_name and engine, counters exposed with the `_total` suffix as prometheus_client
writes them, request success counted per finished_reason (abort = aborted requests).
"""

from __future__ import annotations

_GAUGES = (
    ("num_requests_running", "Number of requests in model execution batches."),
    ("num_requests_waiting", "Number of requests waiting to be processed."),
    ("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
)
_COUNTERS = (
    ("prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."),
    ("prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."),
    ("num_preemptions", "Cumulative number of preemption from the engine."),
    ("prompt_tokens", "Number of prefill tokens processed."),
    ("generation_tokens", "Number of generation tokens processed."),
)
_FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render(metrics: dict, model_name: str) -> str:
    labels = f'engine="0",model_name="{_escape(model_name)}"'
    lines = []
    for name, doc in _GAUGES:
        lines += [f"# HELP vllm:{name} {doc}", f"# TYPE vllm:{name} gauge",
                  f"vllm:{name}{{{labels}}} {float(metrics[name])}"]
    for name, doc in _COUNTERS:
        lines += [f"# HELP vllm:{name}_total {doc}", f"# TYPE vllm:{name}_total counter",
                  f"vllm:{name}_total{{{labels}}} {float(metrics[name])}"]
    lines += ["# HELP vllm:request_success_total Count of successfully processed requests.",
              "# TYPE vllm:request_success_total counter"]
    for reason in _FINISHED_REASONS:
        value = float(metrics[f"request_success_{reason}"])
        lines.append(f'vllm:request_success_total{{{labels},finished_reason="{reason}"}} {value}')
    return "\n".join(lines) + "\n"
