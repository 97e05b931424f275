"""Engine statistics, as vllm/v1/metrics/stats.py: PrefixCacheStats (per-step prefix
cache lookups), CachingMetrics (hit rate over the most recent requests), SchedulerStats
(what Scheduler.make_stats returns each step).

Their cumulative fold for the C ABI is engine/stats_aggregator.py.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class BaseCacheStats:
    reset: bool = False  # the cache was reset before this update
    requests: int = 0
    queries: int = 0  # tokens looked up
    hits: int = 0  # tokens found


@dataclass
class PrefixCacheStats(BaseCacheStats):
    preempted_requests: int = 0  # lookups by previously preempted requests
    preempted_queries: int = 0
    preempted_hits: int = 0

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits


class CachingMetrics:
    """Hit rate of the most recent `max_recent_requests` requests."""

    def __init__(self, max_recent_requests: int = 1000) -> None:
        self.max_recent_requests = max_recent_requests
        self.aggregated_requests = 0
        self.aggregated_query_total = 0
        self.aggregated_query_hit = 0
        self.query_queue: deque[tuple[int, int, int]] = deque()

    def observe(self, stats: BaseCacheStats) -> None:
        if stats.reset:
            self.reset()
        if stats.requests == 0:  # empty updates would push useful ones out
            return
        self.query_queue.append((stats.requests, stats.queries, stats.hits))
        self.aggregated_requests += stats.requests
        self.aggregated_query_total += stats.queries
        self.aggregated_query_hit += stats.hits
        # drop the oldest updates over the window, always keeping the latest one
        while len(self.query_queue) > 1 and \
                self.aggregated_requests > self.max_recent_requests:
            old_requests, old_queries, old_hits = self.query_queue.popleft()
            self.aggregated_requests -= old_requests
            self.aggregated_query_total -= old_queries
            self.aggregated_query_hit -= old_hits

    def reset(self) -> None:
        self.aggregated_requests = 0
        self.aggregated_query_total = 0
        self.aggregated_query_hit = 0
        self.query_queue.clear()

    @property
    def empty(self) -> bool:
        return self.aggregated_requests == 0

    @property
    def hit_rate(self) -> float:
        if self.aggregated_query_total == 0:
            return 0.0
        return self.aggregated_query_hit / self.aggregated_query_total


@dataclass
class SchedulerStats:
    num_running_reqs: int = 0
    num_waiting_reqs: int = 0  # waiting requests not deferred
    num_skipped_waiting_reqs: int = 0  # deferred by a blocked status (none here yet)
    step_counter: int = 0
    current_wave: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_stats: PrefixCacheStats = field(default_factory=PrefixCacheStats)
