"""AsyncLLM: one background thread drives an LLMEngine; each request streams its outputs.

Mirrors vllm/v1/engine/async_llm.py (AsyncLLM.add_request / abort / shutdown, the output
handler that fans engine outputs out to per-request queues, EngineDeadError from
vllm/v1/engine/exceptions.py) and RequestOutputCollector of
vllm/v1/engine/output_processor.py, with threads instead of asyncio: the C ABI and the
HTTP server call it from plain OS threads.

- `lock` (a FairRLock) serializes every LLMEngine call; the loop holds it for one step at
  a time, steps aside between steps while other threads wait for it (so adds and aborts
  are not starved), and sleeps on a condition variable when no request is unfinished.
  What never changes after the engine is built (config, tokenizer, model info) is read
  without it, and so are the last step's stats (get_stats) and the engine's health: no
  probe waits for a step.
- Outputs are DELTA (add_request sets output_kind) and are handed to their stream after
  the lock is released: a stream's consumer or push callback may call back in.
- With the engine core in a child process (LLMEngine.is_multiprocess) the loop waits for
  the core's next outputs without the lock, then takes it to turn them into
  RequestOutputs; aborts wake it (EngineCoreClient.wakeup).
- A failing step or a dead core process kills the engine: every live stream ends with
  EngineDeadError and later add_request calls raise its refusal(). A request the engine
  failed alone (RequestOutput.error, e.g. its grammar did not compile) ends its stream
  with that error; the others go on.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from libvllm.engine.errors import NotFoundError
from libvllm.engine.exceptions import INVALID_STATE, EngineClosedError, EngineDeadError
from libvllm.engine.fair_lock import FairRLock
from libvllm.engine.outputs import PoolingRequestOutput, RequestOutput
from libvllm.engine.pooling_params import PoolingParams
from libvllm.engine.sampling_params import RequestOutputKind, SamplingParams

if TYPE_CHECKING:  # the engine (torch) is imported by whoever builds the LLMEngine
    from libvllm.engine.llm_engine import LLMEngine

logger = logging.getLogger(__name__)


OutputCallback = Callable[["RequestOutput | BaseException"], None]
_FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")


class StatsCollector:
    """The request counters of vLLM's PrometheusStatLogger (vllm/v1/metrics/loggers.py),
    counted from DELTA outputs, plus the scheduler's and KV cache's gauges."""

    def __init__(self) -> None:
        self.prompt_tokens = 0  # vllm:prompt_tokens (counted at a request's first token)
        self.generation_tokens = 0  # vllm:generation_tokens
        self.request_success = dict.fromkeys(_FINISH_REASONS, 0)  # by finished_reason
        self._prefilled: set[str] = set()

    def observe(self, outputs: list[RequestOutput | PoolingRequestOutput]) -> None:
        for out in outputs:
            if isinstance(out, PoolingRequestOutput):  # one prompt, no generated tokens
                self.prompt_tokens += len(out.prompt_token_ids)
                continue
            new_tokens = sum(len(c.token_ids) for c in out.outputs)
            if new_tokens and out.request_id not in self._prefilled:
                self._prefilled.add(out.request_id)
                self.prompt_tokens += len(out.prompt_token_ids)
            self.generation_tokens += new_tokens
            for completion in out.outputs:
                if completion.finish_reason is not None:
                    self.request_success[completion.finish_reason] = (
                        self.request_success.get(completion.finish_reason, 0) + 1)
            if out.finished:
                self._prefilled.discard(out.request_id)

    def count_errors(self, n: int) -> None:
        self.request_success["error"] += n

    def snapshot(self, engine: LLMEngine, refresh: bool = True) -> dict:
        """Gauges as of now (refresh; needs the engine's lock) or as of the last step,
        counters since the engine started."""
        # engine/stats_aggregator.py EngineStats, gauges refreshed or the last step's
        cumulative = engine.get_stats() if refresh else engine.stats.stats
        return {
            "num_requests_running": cumulative.num_running_reqs,
            "num_requests_waiting": cumulative.num_waiting_reqs,
            "kv_cache_usage_perc": cumulative.kv_cache_usage,
            "prefix_cache_queries": cumulative.prefix_cache_queries,
            "prefix_cache_hits": cumulative.prefix_cache_hits,
            "num_preemptions": cumulative.num_preemptions,
            "prompt_tokens": self.prompt_tokens,
            "generation_tokens": self.generation_tokens,
            "request_success": dict(self.request_success),
        }


class RequestStream:
    """The outputs of one request, in order: pulled with get() or pushed to a callback.
    DELTA outputs the puller has not taken yet merge into one (vLLM's
    RequestOutputCollector), so a consumer that lags gets fewer, larger deltas."""

    def __init__(self, request_id: str, cancel: Callable[[str], None],
                 on_output: OutputCallback | None = None) -> None:
        self.request_id = request_id
        self._cancel = cancel
        self._on_output = on_output
        self._cond = threading.Condition(threading.Lock())
        self._items: deque[RequestOutput | BaseException] = deque()
        self._ended = False  # the terminal output (or error) was handed out

    @property
    def pushes(self) -> bool:
        return self._on_output is not None

    def get(self, timeout_s: float | None = None) -> RequestOutput | None:
        """The next DELTA output; None on timeout. After the output with finished=True
        (or the error that ended the request, raised here once) it raises EOFError."""
        if self._on_output is not None:
            raise EngineClosedError(f"request {self.request_id!r} streams to a callback")
        with self._cond:
            if self._ended:
                raise EOFError(f"request {self.request_id!r} has ended")
            if not self._cond.wait_for(lambda: self._items, timeout_s):
                return None
            item = self._items.popleft()
            if isinstance(item, BaseException):
                self._ended = True
                raise item
            self._ended = item.finished
            return item

    def cancel(self) -> None:
        self._cancel(self.request_id)

    def _put(self, item: RequestOutput | BaseException) -> None:
        if self._on_output is not None:
            self._on_output(item)
            return
        with self._cond:
            last = self._items[-1] if self._items else None
            if isinstance(item, RequestOutput) and isinstance(last, RequestOutput):
                # the consumer lags: one merged DELTA output, as vLLM's RequestOutputCollector
                last.add(item, aggregate=True)
            else:
                self._items.append(item)
            self._cond.notify_all()


class AsyncLLM:
    def __init__(self, engine: LLMEngine, *, stats: StatsCollector | None = None,
                 lock: FairRLock | None = None) -> None:
        self.engine = engine
        self.lock = lock or FairRLock()
        self.stats = stats or StatsCollector()
        self._wakeup = threading.Condition(self.lock)
        self._streams: dict[str, RequestStream] = {}
        self._delivering = 0  # push requests whose last output is with their callback
        self._closed = False
        self._dead: EngineDeadError | None = None
        # daemon: a non-daemon thread would hang a Python host at exit
        self._thread = threading.Thread(target=self._run, name="vllm-engine-loop", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- requests

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                    on_output: OutputCallback | None = None,
                    reasoning_parser_kwargs: dict | None = None, priority: int = 0,
                    cache_salt: str | None = None) -> RequestStream:
        """Queues a request. on_output (optional) receives every output, or the error
        that ended the request, on the loop thread instead of the stream's get().
        priority and cache_salt as LLMEngine.add_request."""
        params.output_kind = RequestOutputKind.DELTA
        stream = RequestStream(request_id, self.abort, on_output)
        with self.lock:
            self._check_open()
            self.engine.add_request(request_id, prompt, params, priority, cache_salt,
                                    reasoning_parser_kwargs=reasoning_parser_kwargs)
            self._streams[request_id] = stream
            self._wakeup.notify()
        return stream

    def add_pooling_request(self, request_id: str, prompt: str | list[int],
                            params: PoolingParams) -> RequestStream:
        """Queues a pooling request (LLMEngine.add_pooling_request); its stream gives one
        PoolingRequestOutput."""
        stream = RequestStream(request_id, self.abort)
        with self.lock:
            self._check_open()
            self.engine.add_pooling_request(request_id, prompt, params)
            self._streams[request_id] = stream
            self._wakeup.notify()
        return stream

    def abort(self, request_id: str) -> None:
        """Ends a request (its last output has finish_reason "abort"); a no-op for
        requests that finished or never existed."""
        with self.lock:
            if request_id not in self._streams:
                return
            try:
                self.engine.abort_request(request_id)
            except NotFoundError:  # already aborted: its last output is pending
                return
            self._wakeup.notify()
            self.engine.engine_core.wakeup()  # a multiprocess loop waits on the core

    def has_request(self, request_id: str) -> bool:
        """True while the request's last output has not been handed to its stream."""
        with self.lock:
            return request_id in self._streams

    def num_unfinished(self) -> int:
        """Requests in the engine, plus push requests whose last callback has not
        returned yet (vllm.h: unfinished until the last output is delivered)."""
        with self.lock:
            return len(self._streams) + self._delivering

    def get_stats(self) -> dict:
        """vLLM's engine metrics (names of vllm/v1/metrics/loggers.py without `vllm:`).
        Never waits for a step (vLLM's /metrics reads what the core last sent): while one
        runs, the gauges are those of the last step."""
        if not self.lock.acquire(blocking=False):
            return self.stats.snapshot(self.engine, refresh=False)
        try:
            return self.stats.snapshot(self.engine)
        finally:
            self.lock.release()

    def check_health(self) -> None:
        """vLLM's AsyncLLM.check_health: raises EngineDeadError once the loop failed or the
        engine-core process died (noticed by the core client alone, with no request in
        flight). Takes no lock: a health probe never waits for a step."""
        if self._dead is not None:
            raise self._dead.refusal()
        if self._closed:  # vLLM's errored: not running
            raise EngineDeadError("the engine is shut down", INVALID_STATE, INVALID_STATE)
        self.engine.check_health()

    # ---------------------------------------------------------------- lifecycle

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stops accepting requests, aborts the live ones (their streams get their last
        output), and waits up to timeout_s for the loop thread to end."""
        with self.lock:
            self._closed = True
            for request_id in list(self._streams):
                self.abort(request_id)
            self._wakeup.notify()
            self.engine.engine_core.wakeup()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)

    def _check_open(self) -> None:
        if self._dead is not None:
            raise self._dead.refusal()
        if self._closed:
            raise EngineClosedError("the engine is shut down")

    def _run(self) -> None:
        while True:
            with self.lock:
                while not self.engine.has_unfinished_requests():
                    if self._closed:
                        return
                    self._wakeup.wait()
                try:
                    outputs = self._step()
                except BaseException as e:  # noqa: BLE001 - any failure ends every stream
                    self._die(e)
                    return
                # only this client's requests count (an engine may carry leftovers of an
                # earlier client, e.g. the final outputs of requests it aborted)
                self.stats.observe([o for o in outputs if o.request_id in self._streams])
                ready = [(self._streams.get(out.request_id), out) for out in outputs]
                for out in outputs:
                    if out.finished:
                        self._streams.pop(out.request_id, None)
                self._delivering += sum(1 for stream, out in ready
                                        if stream is not None and stream.pushes and out.finished)
            for stream, out in ready:
                if stream is not None:
                    _deliver(stream, out if out.error is None else out.error)
                    if stream.pushes and out.finished:
                        with self.lock:
                            self._delivering -= 1
            self.lock.yield_to_waiters()

    def _step(self) -> list[RequestOutput]:
        """One step's outputs; called and returns with the lock held. A multiprocess
        engine's core outputs are awaited with the lock released."""
        engine = self.engine
        if not engine.is_multiprocess:
            return engine.step()
        outputs = engine.take_pending_outputs()
        if outputs:
            return outputs
        self.lock.release()
        try:
            core_outputs = engine.engine_core.get_output()
        finally:
            self.lock.acquire()
        return engine.process_engine_core_outputs(core_outputs) + \
            engine.take_pending_outputs()

    def _die(self, exc: BaseException) -> None:
        if isinstance(exc, EngineDeadError):  # the core process died
            self._dead = EngineDeadError(str(exc), refusal_status=exc.refusal_status)
        else:
            self._dead = EngineDeadError(
                f"the engine loop failed: {type(exc).__name__}: {exc}")
        streams, self._streams = list(self._streams.values()), {}
        self.stats.count_errors(len(streams))
        for stream in streams:
            _deliver(stream, self._dead)


def _deliver(stream: RequestStream, item: RequestOutput | BaseException) -> None:
    """A failing push callback must not stop the loop: log it and go on."""
    try:
        stream._put(item)
    except Exception:
        logger.exception("output callback of request %r failed", stream.request_id)
