"""StatsAggregator and EngineStats (ours): successive SchedulerStats folded into the
cumulative numbers vLLM exports through its Prometheus logger (vllm/v1/metrics/loggers.py:
num_requests_running, num_requests_waiting, kv_cache_usage_perc, prefix_cache_queries,
prefix_cache_hits, num_preemptions), which the C ABI reports.
"""

from __future__ import annotations

from dataclasses import dataclass

from libvllm.engine.metrics import CachingMetrics, SchedulerStats


@dataclass
class EngineStats:
    """Cumulative engine numbers (vLLM's Prometheus gauges and counters)."""

    num_running_reqs: int = 0  # vllm:num_requests_running
    num_waiting_reqs: int = 0  # vllm:num_requests_waiting
    kv_cache_usage: float = 0.0  # vllm:kv_cache_usage_perc, as a fraction
    prefix_cache_queries: int = 0  # vllm:prefix_cache_queries (tokens)
    prefix_cache_hits: int = 0  # vllm:prefix_cache_hits (tokens)
    num_preemptions: int = 0  # vllm:num_preemptions
    prefix_cache_hit_rate: float = 0.0  # over the last 1000 requests (CachingMetrics)


class StatsAggregator:
    def __init__(self) -> None:
        self.stats = EngineStats()
        self.prefix_caching_metrics = CachingMetrics()

    def observe(self, scheduler_stats: SchedulerStats | None, num_preemptions: int) -> None:
        """Fold one step's SchedulerStats; num_preemptions is the scheduler's total."""
        s = self.stats
        s.num_preemptions = num_preemptions
        if scheduler_stats is None:
            return
        s.num_running_reqs = scheduler_stats.num_running_reqs
        s.num_waiting_reqs = scheduler_stats.num_waiting_reqs
        s.kv_cache_usage = scheduler_stats.kv_cache_usage
        prefix = scheduler_stats.prefix_cache_stats
        s.prefix_cache_queries += prefix.queries
        s.prefix_cache_hits += prefix.hits
        self.prefix_caching_metrics.observe(prefix)
        s.prefix_cache_hit_rate = self.prefix_caching_metrics.hit_rate
