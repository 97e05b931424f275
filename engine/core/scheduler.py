"""Scheduler: one token budget per step, no prefill/decode phases, as
vllm/v1/core/sched/scheduler.py.

Running requests are served first (decode or the next prefill chunk); when the KV
pool is short the newest running request is preempted (recompute: its blocks are
freed and it goes back to the front of the waiting queue). Waiting requests are
admitted FCFS while budget, seats (max_num_seqs) and blocks last.
"""

from __future__ import annotations

from collections import deque

from engine.config import EngineConfig
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.sched_output import (
    CachedRequestData,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
)
from engine.request import Request, RequestStatus


def check_stop(request: Request, max_model_len: int) -> bool:
    """vllm/v1/core/sched/utils.py::check_stop (EOS, stop ids, length)."""
    sp = request.sampling_params
    last = request.output_token_ids[-1]
    if not sp.ignore_eos and last == request.eos_token_id:
        request.status = RequestStatus.FINISHED_STOPPED
        return True
    if last in sp.stop_token_ids:
        request.status = RequestStatus.FINISHED_STOPPED
        request.stop_reason = last
        return True
    if request.num_tokens >= max_model_len or request.num_output_tokens >= request.max_tokens:
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    return False


class Scheduler:
    def __init__(self, config: EngineConfig, kv_cache_manager: KVCacheManager,
                 max_model_len: int) -> None:
        self.max_num_running_reqs = config.max_num_seqs
        self.max_num_scheduled_tokens = config.max_num_batched_tokens
        self.enable_chunked_prefill = config.enable_chunked_prefill
        self.max_model_len = max_model_len
        self.kv_cache_manager = kv_cache_manager
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.finished_req_ids: set[str] = set()
        self.num_preemptions = 0

    def add_request(self, request: Request) -> None:
        self.waiting.append(request)
        self.requests[request.request_id] = request

    def get_num_unfinished_requests(self) -> int:
        return len(self.waiting) + len(self.running)

    def has_unfinished_requests(self) -> bool:
        return self.get_num_unfinished_requests() > 0

    def schedule(self) -> SchedulerOutput:
        budget = self.max_num_scheduled_tokens
        num_scheduled: dict[str, int] = {}
        new_reqs: list[NewRequestData] = []
        cached = CachedRequestData()
        preempted: set[str] = set()
        resumed: list[Request] = []

        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            while (new_blocks := self.kv_cache_manager.allocate_slots(req, n)) is None:
                victim = self.running.pop()  # newest first
                self._preempt(victim)
                preempted.add(victim.request_id)
                if victim is req:
                    break
            if req.request_id in preempted:
                break
            num_scheduled[req.request_id] = n
            budget -= n
            cached.req_ids.append(req.request_id)
            cached.new_block_ids.append([b.block_id for b in new_blocks])
            cached.num_computed_tokens.append(req.num_computed_tokens)
            i += 1

        while self.waiting and not preempted and budget > 0 and \
                len(self.running) < self.max_num_running_reqs:
            req = self.waiting[0]
            hits, num_hit_tokens = self.kv_cache_manager.get_computed_blocks(req)
            n = req.num_tokens - num_hit_tokens
            if n > budget:
                if not self.enable_chunked_prefill:
                    break
                n = budget
            if self.kv_cache_manager.allocate_slots(req, n, hits) is None:
                break
            self.waiting.popleft()
            if req.status == RequestStatus.PREEMPTED:
                resumed.append(req)
            req.status = RequestStatus.RUNNING
            req.num_computed_tokens = num_hit_tokens
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = num_hit_tokens
            self.running.append(req)
            num_scheduled[req.request_id] = n
            budget -= n
            new_reqs.append(NewRequestData(
                req.request_id, list(req.all_token_ids), req.sampling_params,
                self.kv_cache_manager.get_block_ids(req.request_id), num_hit_tokens))

        out = SchedulerOutput(new_reqs, cached, num_scheduled, sum(num_scheduled.values()),
                              self.finished_req_ids | preempted, preempted)
        self.finished_req_ids = set()
        for req_id, n in num_scheduled.items():
            self.requests[req_id].num_computed_tokens += n
        return out

    def _preempt(self, req: Request) -> None:
        self.kv_cache_manager.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def update_from_output(self, sched_out: SchedulerOutput,
                           runner_out: ModelRunnerOutput) -> list[tuple[Request, list[int]]]:
        """Append sampled tokens, run stop checks, free finished requests.

        Returns (request, new token ids) for every request that produced tokens or
        finished this step.
        """
        results = []
        for req_id, new_ids in zip(runner_out.req_ids, runner_out.sampled_token_ids):
            req = self.requests.get(req_id)
            if req is None or req.is_finished() or not new_ids:
                continue
            req.append_output_token_ids(new_ids)
            if check_stop(req, self.max_model_len):
                self._free_request(req)
            results.append((req, new_ids))
        return results

    def finish_requests(self, req_ids: list[str], status: RequestStatus) -> list[Request]:
        done = []
        for req_id in req_ids:
            req = self.requests.get(req_id)
            if req is None or req.is_finished():
                continue
            if req.status == RequestStatus.RUNNING:
                self.running.remove(req)
            else:
                self.waiting.remove(req)
            req.status = status
            self._free_request(req)
            done.append(req)
        return done

    def _free_request(self, req: Request) -> None:
        if req in self.running:
            self.running.remove(req)
        self.kv_cache_manager.free(req)
        self.finished_req_ids.add(req.request_id)
        del self.requests[req.request_id]
