"""Scheduler: one token budget per step, no prefill/decode phases, as
vllm/v1/core/sched/scheduler.py (no spec decode, connectors or encoder inputs).

Each step serves running requests first (a decode token or the next prefill chunk);
when the block pool (KV blocks, and for a hybrid model the GDN state block each running
request holds per group) is short a running request is preempted (recompute: its blocks are
freed and it waits again), the newest under FCFS, the lowest priority (then latest
arrival) under the priority policy. If nobody was preempted, waiting requests are
admitted in policy order while budget, seats (max_num_seqs) and blocks last, reusing
prefix-cache hits. A request whose structured-output grammar is still compiling is
skipped until it is ready (WAITING_FOR_FSM); one whose grammar failed ends FINISHED_ERROR.
get_grammar_bitmask gives the bitmask rows of the structured requests sampled this step,
and update_from_output advances their matchers (a rejected token fails the request).
Async scheduling (engine/core/async_scheduler.py) counts the tokens of steps in flight as
num_output_placeholders: a running request is scheduled past them, and not at all once
the step in flight samples its last token (max_tokens).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from libvllm.engine.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
from libvllm.engine.core.mamba_align import MambaAlignCache
from libvllm.engine.core.request_queue import SchedulingPolicy, create_request_queue
from libvllm.engine.core.sched_output import (
    CachedRequestData,
    GrammarOutput,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
)
from libvllm.engine.core.sched_utils import check_stop, remove_all
from libvllm.engine.errors import OutOfResourcesError, VllmError
from libvllm.engine.metrics import SchedulerStats
from libvllm.engine.request import Request, RequestStatus
from libvllm.engine.resolved_config import SchedulerConfig

if TYPE_CHECKING:
    from libvllm.engine.structured_output import StructuredOutputManager


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv_cache_manager: KVCacheManager,
                 log_stats: bool = True,
                 structured_output_manager: StructuredOutputManager | None = None) -> None:
        self.config = config  # resolved (engine/resolved_config.py), read only
        self.max_num_running_reqs = config.max_num_seqs
        self.max_num_scheduled_tokens = config.max_num_batched_tokens
        self.max_model_len = config.max_model_len
        self.policy = SchedulingPolicy(config.policy)
        self.kv_cache_manager = kv_cache_manager
        self.block_size = kv_cache_manager.block_size
        self.log_stats = log_stats
        self.requests: dict[str, Request] = {}
        self.waiting = create_request_queue(self.policy)
        self.running: list[Request] = []
        # finished / preempted since the last schedule(): handed to the runner, then reset
        self.finished_req_ids: set[str] = set()
        self.reset_preempted_req_ids: set[str] = set()
        self.num_preemptions = 0  # total, for vllm:num_preemptions
        # hybrid GDN models with prefix caching: saved states (engine/core/mamba_align.py)
        self.mamba_align: MambaAlignCache | None = None
        self.structured_output_manager = structured_output_manager
        self.errored_requests: list[Request] = []  # FINISHED_ERROR, not yet reported

    def add_request(self, request: Request) -> None:
        self._check_fits_kv_cache(request)
        self.waiting.add_request(request)
        self.requests[request.request_id] = request

    def _check_fits_kv_cache(self, request: Request) -> None:
        """Fail a request the KV cache can never hold instead of letting it wait forever
        (vLLM relies on its start-up check alone)."""
        # the last sampled token is never fed back, so it needs no KV slot
        num_slots = min(request.num_prompt_tokens + request.max_tokens, self.max_model_len) - 1
        needed = -(-max(num_slots, request.num_prompt_tokens) // self.block_size)
        # the null block and the request's GDN state blocks are not for KV
        usable = self.kv_cache_manager.block_pool.num_gpu_blocks - 1 - len(
            self.kv_cache_manager.mamba_managers)
        if needed > usable:
            raise OutOfResourcesError(
                f"Request {request.request_id} needs {needed} KV cache blocks "
                f"({request.num_prompt_tokens} prompt tokens + up to {request.max_tokens} "
                f"new) but the KV cache has {usable} blocks of {self.block_size} tokens. "
                f"Lower max_tokens or increase the KV cache memory.")

    def get_request_counts(self) -> tuple[int, int]:
        """(num_running_reqs, num_waiting_reqs)."""
        return len(self.running), len(self.waiting)

    def get_num_unfinished_requests(self) -> int:
        return len(self.waiting) + len(self.running)

    def has_unfinished_requests(self) -> bool:
        return self.get_num_unfinished_requests() > 0

    def has_finished_requests(self) -> bool:
        return bool(self.finished_req_ids)

    def get_kv_cache_usage(self) -> float:
        return self.kv_cache_manager.usage

    def _long_prefill_threshold(self) -> int:
        """The chunk cap, only when another request could be starved by a long prefill."""
        num_eligible = len(self.running) + len(self.waiting)
        threshold = self.config.long_prefill_token_threshold if num_eligible > 1 else 0
        if threshold > 0 and self.config.long_prefill_token_threshold_adaptive:
            threshold = max(threshold, self.max_num_scheduled_tokens // num_eligible)
        return threshold

    def schedule(self) -> SchedulerOutput:
        token_budget = self.max_num_scheduled_tokens
        threshold = self._long_prefill_threshold()
        num_scheduled_tokens: dict[str, int] = {}
        req_to_new_blocks: dict[str, KVCacheBlocks] = {}
        scheduled_running: list[Request] = []
        scheduled_new: list[Request] = []
        preempted: list[Request] = []
        restore_blocks: dict[str, list[int] | None] = {}  # new request -> saved GDN state
        if self.mamba_align is not None:  # the last step's state copies are issued
            self.mamba_align.release_pending()

        # First, the RUNNING requests.
        req_index = 0
        while req_index < len(self.running) and token_budget > 0:
            request = self.running[req_index]
            if request.num_output_placeholders > 0 and request.num_computed_tokens + 2 - \
                    request.num_output_placeholders >= request.num_prompt_tokens + \
                    request.max_tokens:  # the step in flight samples its last token
                req_index += 1
                continue
            num_new = (request.num_tokens + request.num_output_placeholders
                       - request.num_computed_tokens)
            if 0 < threshold < num_new:
                num_new = threshold
            num_new = min(num_new, token_budget,
                          self.max_model_len - request.num_computed_tokens - 1)
            if self.mamba_align is not None:
                num_new = self.mamba_align.align_num_new(request.num_computed_tokens, num_new)
            if num_new <= 0:  # nothing to compute (e.g. output pending): others may run
                req_index += 1
                continue
            while (new_blocks := self.kv_cache_manager.allocate_slots(request, num_new)) \
                    is None:
                if self.policy == SchedulingPolicy.PRIORITY:
                    victim = max(self.running, key=lambda r: (r.priority, r.arrival_time))
                    victim_index = self.running.index(victim)
                    del self.running[victim_index]
                    if victim_index < req_index:
                        req_index -= 1
                    if victim in scheduled_running:  # give its share of this step back
                        scheduled_running.remove(victim)
                        token_budget += num_scheduled_tokens.pop(victim.request_id)
                        req_to_new_blocks.pop(victim.request_id)
                else:
                    victim = self.running.pop()
                self._preempt_request(victim)
                preempted.append(victim)
                if victim is request:
                    break
            if new_blocks is None:
                if self.policy == SchedulingPolicy.PRIORITY:
                    continue  # later (higher-priority) requests may still fit
                break
            scheduled_running.append(request)
            req_to_new_blocks[request.request_id] = new_blocks
            num_scheduled_tokens[request.request_id] = num_new
            token_budget -= num_new
            req_index += 1

        # Next, the WAITING requests (not in a step that had to preempt).
        skipped_waiting: list[Request] = []
        while not preempted and token_budget > 0 and self.waiting and \
                len(self.running) < self.max_num_running_reqs:
            request = self.waiting.peek_request()  # num_computed_tokens is 0 here
            if request.status == RequestStatus.WAITING_FOR_FSM and \
                    not self._grammar_ready(request):
                self.waiting.pop_request()
                if not request.is_finished():  # still compiling: retry next step
                    skipped_waiting.append(request)
                continue
            hit_blocks, num_hit_tokens = self.kv_cache_manager.get_computed_blocks(request)
            restore = None
            if self.mamba_align is not None:  # hits need a saved GDN state
                k, restore = self.mamba_align.trim_hit(request, len(hit_blocks.blocks))
                hit_blocks = KVCacheBlocks(hit_blocks.blocks[:k])
                num_hit_tokens = k * self.kv_cache_manager.block_size
            num_new = request.num_tokens - num_hit_tokens
            if 0 < threshold < num_new:
                num_new = threshold
            if not self.config.enable_chunked_prefill and num_new > token_budget:
                break  # a prompt is never split: the ones behind it wait too (FCFS)
            num_new = min(num_new, token_budget)
            if self.mamba_align is not None:
                request.num_computed_tokens = num_hit_tokens  # as align_num_new reads it
                num_new = self.mamba_align.align_num_new(request.num_computed_tokens, num_new)
                request.num_computed_tokens = 0
            new_blocks = self.kv_cache_manager.allocate_slots(
                request, num_new, num_hit_tokens, hit_blocks,
                full_sequence_must_fit=self.config.scheduler_reserve_full_isl,
                has_scheduled_reqs=bool(self.running))
            if new_blocks is None:
                break
            # recorded at admission, so a lookup that could not be scheduled is not counted
            self.kv_cache_manager.record_prefix_cache_stats(request, num_hit_tokens)
            self.waiting.pop_request()
            self.running.append(request)
            scheduled_new.append(request)
            restore_blocks[request.request_id] = restore
            req_to_new_blocks[request.request_id] = self.kv_cache_manager.get_blocks(
                request.request_id)
            num_scheduled_tokens[request.request_id] = num_new
            token_budget -= num_new
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens = num_hit_tokens
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = num_hit_tokens

        self.waiting.prepend_requests(skipped_waiting)
        assert token_budget >= 0 and len(self.running) <= self.max_num_running_reqs
        out = SchedulerOutput(
            scheduled_new_reqs=[
                NewRequestData(r.request_id, list(r.all_token_ids), r.sampling_params,
                               req_to_new_blocks[r.request_id].get_block_ids(),
                               r.num_computed_tokens, list(r.prompt_token_ids),
                               self.kv_cache_manager.get_state_block_ids(r.request_id),
                               restore_blocks[r.request_id])
                for r in scheduled_new],
            scheduled_cached_reqs=CachedRequestData(
                [r.request_id for r in scheduled_running],
                [req_to_new_blocks[r.request_id].get_block_ids() for r in scheduled_running],
                [r.num_computed_tokens for r in scheduled_running]),
            num_scheduled_tokens=num_scheduled_tokens,
            total_num_scheduled_tokens=sum(num_scheduled_tokens.values()),
            finished_req_ids=self.finished_req_ids,
            preempted_req_ids=self.reset_preempted_req_ids)
        if self.mamba_align is not None:
            out.mamba_saves = [(r.request_id, blocks)
                               for r in (*scheduled_running, *scheduled_new)
                               if (blocks := self.mamba_align.plan_save(
                                   r, num_scheduled_tokens[r.request_id])) is not None]
        self._update_after_schedule(out)
        return out

    def _grammar_ready(self, request: Request) -> bool:
        """WAITING once its grammar compiled; a grammar that failed fails the request."""
        grammar = request.structured_output_request.grammar  # polls the compile
        if grammar is None:
            return False
        if isinstance(grammar, Exception):
            self._fail_request(request, grammar)
            return False
        request.status = RequestStatus.WAITING
        return True

    def _fail_request(self, request: Request, error: Exception) -> None:
        """FINISHED_ERROR for this request only; the caller removes it from its queue."""
        request.status = RequestStatus.FINISHED_ERROR
        request.error = error if isinstance(error, VllmError) else VllmError(
            f"{type(error).__name__}: {error}")
        self._free_request(request)
        self.errored_requests.append(request)

    def take_errored_requests(self) -> list[Request]:
        """Requests failed since the last call (their final output is still to be made)."""
        errored, self.errored_requests = self.errored_requests, []
        return errored

    def get_grammar_bitmask(self, scheduler_output: SchedulerOutput) -> GrammarOutput | None:
        """Bitmask rows of the structured-output requests that sample a token this step
        (their scheduled tokens reach the end of what is known), in batch order."""
        if self.structured_output_manager is None:
            return None
        req_ids, so_requests = [], []
        for req_id in scheduler_output.num_scheduled_tokens:
            request = self.requests.get(req_id)
            if request is not None and request.use_structured_output and \
                    request.num_computed_tokens == request.num_tokens:
                req_ids.append(req_id)
                so_requests.append(request.structured_output_request)
        if not so_requests:
            return None
        return GrammarOutput(req_ids,
                             self.structured_output_manager.grammar_bitmask(so_requests))

    def _update_after_schedule(self, out: SchedulerOutput) -> None:
        # computed tokens advance now, so the next step can schedule the next chunk
        for req_id, num_tokens in out.num_scheduled_tokens.items():
            request = self.requests[req_id]
            request.num_computed_tokens += num_tokens
            request.is_prefill_chunk = request.num_computed_tokens < (
                request.num_tokens + request.num_output_placeholders)
        self.finished_req_ids = set()
        self.reset_preempted_req_ids = set()

    def _preempt_request(self, request: Request) -> None:
        """Recompute preemption; the caller has removed it from `running`."""
        assert request.status == RequestStatus.RUNNING, "Only running requests can be preempted"
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_output_placeholders = 0  # a step in flight still delivers its token
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.prepend_request(request)
        self.reset_preempted_req_ids.add(request.request_id)

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           model_runner_output: ModelRunnerOutput
                           ) -> list[tuple[Request, list[int]]]:
        """Append sampled tokens, check stop conditions, free finished requests.
        Returns (request, new token ids) for each scheduled request that produced tokens
        or finished; requests finished meanwhile (aborted) are skipped. Under async
        scheduling a request preempted while this step was in flight still takes its
        token (it is recomputed with the rest)."""
        req_id_to_index = model_runner_output.req_id_to_index
        results, stopped_reqs = [], set()
        for req_id in scheduler_output.num_scheduled_tokens:
            request = self.requests.get(req_id)
            if request is None or request.is_finished():
                continue
            new_token_ids = model_runner_output.sampled_token_ids[req_id_to_index[req_id]]
            if not new_token_ids:
                continue
            if request.num_output_placeholders > 0:
                request.num_output_placeholders -= len(new_token_ids)
            preempted = request.status == RequestStatus.PREEMPTED  # async: waits again
            new_token_ids, stopped = self._update_request_with_output(request,
                                                                      list(new_token_ids))
            if request.use_structured_output and not self._accept_tokens(request, new_token_ids) \
                    and not stopped:
                if preempted:
                    self.waiting.remove_requests([request])
                else:
                    self.running.remove(request)
                self._fail_request(request, VllmError(
                    f"the structured output grammar of request {req_id} rejected the sampled "
                    f"token(s) {new_token_ids}; the constraint cannot be honoured with these "
                    "sampling parameters"))
                results.append((request, new_token_ids))
                continue
            if stopped:
                if preempted:
                    self.waiting.remove_requests([request])
                stopped_reqs.add(request)
                self._free_request(request)
            results.append((request, new_token_ids))
        self.running = remove_all(self.running, stopped_reqs)
        return results


    def _accept_tokens(self, request: Request, new_token_ids: list[int]) -> bool:
        manager = self.structured_output_manager
        return manager is None or manager.accept_tokens(request.structured_output_request,
                                                        new_token_ids)

    def _update_request_with_output(self, request: Request, new_token_ids: list[int]
                                    ) -> tuple[list[int], bool]:
        for num_new, token_id in enumerate(new_token_ids, 1):
            request.append_output_token_ids(token_id)
            if check_stop(request, self.max_model_len):
                # computed tokens cover all new tokens but the last: keep that after a trim
                request.num_computed_tokens -= len(new_token_ids) - num_new
                return new_token_ids[:num_new], True
        return new_token_ids, False

    def finish_requests(self, request_ids: str | Iterable[str] | None,
                        finished_status: RequestStatus) -> list[Request]:
        """Finish requests from outside (abort, stop string) in any state: waiting,
        running or preempted. None finishes all. Unknown or finished ids are skipped."""
        assert RequestStatus.is_finished(finished_status)
        if isinstance(request_ids, str):
            request_ids = (request_ids,)
        elif request_ids is None:
            request_ids = list(self.requests)
        valid = [r for rid in dict.fromkeys(request_ids)
                 if (r := self.requests.get(rid)) is not None and not r.is_finished()]
        running = {r for r in valid if r.status == RequestStatus.RUNNING}
        self.running = remove_all(self.running, running)
        self.waiting.remove_requests([r for r in valid if r not in running])
        for request in valid:
            request.status = finished_status
            self._free_request(request)
        return valid

    def _free_request(self, request: Request) -> None:
        """Release a finished request (the caller takes it out of its queue)."""
        assert request.is_finished()
        self.kv_cache_manager.free(request)
        self.finished_req_ids.add(request.request_id)
        del self.requests[request.request_id]

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """Drop the prefix cache; with reset_running_requests, preempt every running
        request first (in reverse, so they resume in order). False if blocks are in use."""
        if reset_running_requests:
            while self.running:
                self._preempt_request(self.running.pop())
        if self.mamba_align is not None:  # the held blocks' copies are issued
            self.mamba_align.release_pending()
        return self.kv_cache_manager.reset_prefix_cache()

    def make_stats(self) -> SchedulerStats | None:
        """This step's stats (prefix-cache counts since the previous call)."""
        if not self.log_stats:
            return None
        num_running, num_waiting = self.get_request_counts()
        return SchedulerStats(num_running_reqs=num_running, num_waiting_reqs=num_waiting,
                              kv_cache_usage=self.kv_cache_manager.usage,
                              prefix_cache_stats=self.kv_cache_manager.make_prefix_cache_stats())
