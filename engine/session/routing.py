"""OutputRouter: the caller-driven requests of one engine session and the rule that
routes their outputs to the thread that added each.

Several threads may step one engine (include/vllm.h, "Thread safety"): a request belongs
to the thread that added it. Any thread's step runs the engine for every request
(continuous batching) and routes each sequence's output to its owner's queue; a step
returns the calling thread's queue. A request stays known (its id in use, counted as
unfinished) until its owner took its last output. Mirrors vllm/v1/engine/llm_engine.py
(add_request, step, get_num_unfinished_requests); the routing is ours (vLLM's LLMEngine
is single-threaded). The session calls every method under its lock.
"""

from __future__ import annotations

from typing import NamedTuple

from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.outputs import CompletionOutput, RequestOutput
from libvllm.engine.session.request_times import RequestTimes


class RoutedOutput(NamedTuple):
    """One sequence's output as its owner gets it."""

    result: RequestOutput
    completion: CompletionOutput
    num_output_tokens: int  # the sequence's tokens so far
    first_token_latency: float  # s from arrival; 0.0 before the first token
    last: bool  # the request's last output
    times: RequestTimes


class OutputRouter:
    def __init__(self) -> None:
        self.requests: dict[str, RequestTimes] = {}  # until the owner took the last output
        self.owners: dict[str, int] = {}  # request id -> the thread that added it
        self.adders: set[int] = set()  # threads that ever added a request
        self.pending: dict[int, list[RoutedOutput]] = {}  # thread -> its routed outputs

    def check_new(self, request_id: str) -> None:
        if request_id in self.requests:  # includes ones whose last output is still due
            raise InvalidArgumentError(f"request id {request_id!r} is already in use")

    def added(self, request_id: str, times: RequestTimes, thread: int) -> None:
        self.requests[request_id] = times
        self.owners[request_id] = thread
        self.adders.add(thread)

    def route(self, results: list[RequestOutput]) -> None:
        """Each sequence's output to its owner's queue."""
        for result in results:
            rid = result.request_id
            times = self.requests[rid]
            queue = self.pending.setdefault(self.owners[rid], [])
            for i, completion in enumerate(result.outputs):
                last = result.finished and i == len(result.outputs) - 1
                queue.append(RoutedOutput(result, completion, *times.observe(completion), last,
                                          times))

    def take(self, thread: int) -> list[RoutedOutput]:
        """thread's queue; requests whose last output it holds are forgotten."""
        mine = self.pending.pop(thread, [])
        for out in mine:
            if out.last:
                del self.requests[out.result.request_id], self.owners[out.result.request_id]
        return mine
