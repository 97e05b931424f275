"""EngineCoreProc: the engine core's own process, as vllm/v1/engine/core.py
(EngineCoreProc: run_engine_core, run_busy_loop, process_input_sockets,
process_output_sockets).

`python -m libvllm.engine.engine_core.engine_core_proc --input ADDR --output ADDR --config JSON ...`
(started by engine/engine_core/engine_core_utils.py; JSON: the user's EngineConfig, which
this process resolves, as the in-process core does, and returns in its ready message).
Three threads:
- input thread: zmq PULL -> MsgpackDecoder -> input queue (decoding overlaps the device);
- busy loop (main thread): apply every queued request / abort / utility call, run one
  EngineCore step while there is work, encode its EngineCoreOutputs and send them on its
  own zmq PUSH (and utility results; after a failing step, its traceback and DEAD);
  block on the input queue when idle;
- output thread: output queue -> MsgpackEncoder -> zmq PUSH, for what does not come from
  the busy loop: the handshake and the engine loggers' records.
Unlike vLLM (whose busy loop queues each step's outputs for its output thread), the busy
loop sends them itself: a thread woken every step takes the GIL from the loop in the
middle of the next step's forward (every torch op releases it), so the loop slept about
once a step (1.1-1.25 voluntary context switches a step, 0.01 now) and eager decode,
bound by the loop's Python, ran slower in the child than in process (docs/architecture.md,
"Process model"). Both PUSH sockets reach the front end's one PULL, which keeps no order
between them: READY comes before any request is sent, and DEAD, after which the front end
reads nothing, goes out behind the last step's outputs on the same socket.
The first message on the output socket is the handshake: READY + EngineCoreReady, or
FAILED + EngineCoreStartupFailure (the model did not load: status and message reach
vllm_engine_create); before it, PROGRESS frames of the load, each answered by the front
end on the input socket (engine/engine_core/load_progress_relay.py). A failing step sends
DEAD + the reason, then the process exits (with
tensor parallelism, a dead worker whose collective leaves the loop waiting gets DEAD from
the executor's failure callback instead, end_if_stuck). Log
records of the "engine" loggers go to the front end, which re-emits them. The child exits
when its parent does (a parent-pid watch: PR_SET_PDEATHSIG follows the parent *thread*,
and the host thread that created the engine may end long before the host).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import queue
import threading
import time
import traceback

import zmq

from libvllm.engine.config import EngineConfig
from libvllm.engine.engine_core.engine_core_messages import (
    EngineCoreOutputs,
    EngineCoreRequest,
    EngineCoreRequestType,
    EngineCoreStartupFailure,
    UtilityOutput,
)
from libvllm.engine.engine_core.engine_core_utils import DEAD, FAILED, READY
from libvllm.engine.engine_core.load_progress_relay import LoadProgressRelay
from libvllm.engine.errors import VllmError
from libvllm.engine.executor.multiproc_executor import MultiprocExecutor
from libvllm.engine.serial_utils import MsgpackDecoder, MsgpackEncoder

UTILITY_METHODS = frozenset({"make_stats", "reset_prefix_cache", "peak_memory_bytes"})
_PARENT_POLL_S = 0.5
_STUCK_GRACE_S = 5.0  # a worker's death to DEAD when the busy loop does not get there
logger = logging.getLogger(__name__)


class _ForwardHandler(logging.Handler):
    """Puts each record on the output queue as (level, logger name, message)."""

    def __init__(self, output_queue: queue.Queue) -> None:
        super().__init__()
        self.output_queue = output_queue

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if record.exc_info:
                message += "\n" + logging.Formatter().formatException(record.exc_info)
        except Exception:  # noqa: BLE001 - a bad record must not stop the engine
            return
        self.output_queue.put((None, EngineCoreOutputs(
            log_record=(record.levelno, record.name, message))))


class EngineCoreProc:
    def __init__(self, engine_core, input_address: str, output_address: str,
                 ctx: zmq.Context, input_socket: zmq.Socket | None = None) -> None:
        self.engine_core = engine_core
        self.input_queue: queue.Queue = queue.Queue()
        self.shutdown_requested = False
        self._last_gauges: tuple | None = None
        self.encoder = MsgpackEncoder()
        # the busy loop's own socket: no high-water mark, so a send never blocks the
        # loop (the front end drains it; what it has not read yet waits in zmq)
        self.output_socket = ctx.socket(zmq.PUSH)
        self.output_socket.setsockopt(zmq.SNDHWM, 0)
        self.output_socket.setsockopt(zmq.LINGER, 2000)
        self.output_socket.connect(output_address)
        threading.Thread(target=self.process_input_sockets,
                         args=(ctx, input_address, input_socket),
                         name="vllm-core-input", daemon=True).start()

    def process_input_sockets(self, ctx: zmq.Context, address: str,
                              sock: zmq.Socket | None = None) -> None:
        decoders = {EngineCoreRequestType.ADD: MsgpackDecoder(EngineCoreRequest),
                    EngineCoreRequestType.ABORT: MsgpackDecoder(list[str]),
                    EngineCoreRequestType.UTILITY: MsgpackDecoder(tuple[int, str, list])}
        if sock is None:  # else the load's, connected already (load_progress_relay.py)
            sock = ctx.socket(zmq.PULL)
            sock.connect(address)
        try:
            while True:
                frames = sock.recv_multipart(copy=False)
                kind = EngineCoreRequestType(bytes(frames[0].buffer))
                payload = None if kind == EngineCoreRequestType.SHUTDOWN else \
                    decoders[kind].decode([f.buffer for f in frames[1:]])
                self.input_queue.put((kind, payload))
                if kind == EngineCoreRequestType.SHUTDOWN:
                    return
        except zmq.ContextTerminated:  # the process is ending (run_engine_core's flush)
            return
        finally:
            sock.close(linger=0)

    def run(self) -> int:
        """The busy loop until a shutdown (0) or a failing step (1): then the traceback
        as a log record and DEAD + the reason go out on the loop's own socket, after the
        outputs of every step before (the front end stops reading at DEAD)."""
        try:
            self.run_busy_loop()
            self.engine_core.shutdown()
            return 0
        except Exception as e:  # noqa: BLE001 - the front end ends every request
            self.send_output(EngineCoreOutputs(log_record=(
                logging.ERROR, logger.name, "the engine core failed\n" + traceback.format_exc())))
            self.output_socket.send_multipart(
                [DEAD] + self.encoder.encode(f"the engine core failed: {type(e).__name__}: {e}"),
                copy=False)
            return 1
        finally:
            self.close()

    def run_busy_loop(self) -> None:
        core = self.engine_core
        while not self.shutdown_requested:
            self._process_input_queue(block=not core.has_work())
            if self.shutdown_requested:
                break
            if core.has_work():
                self._send_step(core.step())

    def _send_step(self, outputs: EngineCoreOutputs) -> None:
        """Outputs, or changed gauges; a step with neither (requests waiting for their
        grammar) is not sent, and the loop naps instead of spinning."""
        stats = outputs.scheduler_stats
        gauges = None if stats is None else (
            stats.num_running_reqs, stats.num_waiting_reqs, stats.kv_cache_usage,
            outputs.num_preemptions)
        if outputs.outputs or gauges != self._last_gauges or \
                (stats is not None and stats.prefix_cache_stats.requests):
            self._last_gauges = gauges
            self.send_output(outputs)
        elif not self.engine_core.batch_queue:
            time.sleep(0.001)

    def send_output(self, outputs: EngineCoreOutputs) -> None:
        """Encode and send on the busy loop's socket (no other thread is woken)."""
        self.output_socket.send_multipart(self.encoder.encode(outputs), copy=False)

    def close(self) -> None:
        self.output_socket.close()  # LINGER: what is queued still goes out

    def _process_input_queue(self, block: bool) -> None:
        while True:
            try:
                kind, payload = self.input_queue.get(block=block)
            except queue.Empty:
                return
            block = False
            self._handle(kind, payload)

    def _handle(self, kind: EngineCoreRequestType, payload) -> None:
        core = self.engine_core
        if kind == EngineCoreRequestType.ADD:
            refused = core.add_request(payload)
            if refused is not None:
                self.send_output(EngineCoreOutputs([refused]))
        elif kind == EngineCoreRequestType.ABORT:
            core.abort_requests(payload)
        elif kind == EngineCoreRequestType.UTILITY:
            call_id, method, args = payload
            try:
                if method not in UTILITY_METHODS:
                    raise VllmError(f"unknown utility method {method!r}")
                result = getattr(core, method)(*args)
                out = UtilityOutput(call_id, result=result)
            except Exception as e:  # noqa: BLE001 - the caller gets the failure
                out = UtilityOutput(call_id, failure=f"{type(e).__name__}: {e}")
            self.send_output(EngineCoreOutputs(utility_output=out))
        else:
            self.shutdown_requested = True


def process_output_socket(ctx: zmq.Context, address: str, output_queue: queue.Queue) -> None:
    """Encode and send until a None item; (tag, obj): tag is a handshake/death frame."""
    encoder = MsgpackEncoder()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 2000)
    sock.connect(address)
    while (item := output_queue.get()) is not None:
        tag, obj = item
        frames = encoder.encode(obj)
        sock.send_multipart(([tag] if tag else []) + frames, copy=False)
    sock.close()


def end_if_stuck(reason: str, output_queue: queue.Queue, sender: threading.Thread,
                 ctx: zmq.Context, loop_done: threading.Event) -> None:
    """A tensor-parallel worker died (the executor's failure callback, on its monitor
    thread). The busy loop's next collective normally fails, and its DEAD goes out behind
    the last step's outputs; a collective that instead waits for the dead peer (gloo, until
    its timeout) would leave every stream silent, so if the loop has not ended
    (`loop_done`) after _STUCK_GRACE_S, DEAD + the reason go out on the output thread,
    the context is flushed (the closed socket's frames leave before the exit) and the
    process ends."""
    if loop_done.wait(_STUCK_GRACE_S):
        return
    output_queue.put((DEAD, f"the engine core failed: {reason}"))
    _end_output(output_queue, sender, ctx, 1.0)  # bounded: the stuck loop's socket stays open
    os._exit(1)


def freeze_gc_heap() -> None:
    """The start-up heap (model, KV cache, graphs) moved to the oldest generation and
    frozen, so the collector never scans it again while serving (vllm/utils/gc_utils.py
    freeze_gc_heap, called at the end of vLLM's EngineCore.__init__). The child ends with
    its engine, so nothing needs unfreezing."""
    for generation in (0, 1, 2):
        gc.collect(generation)
    gc.freeze()


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(_PARENT_POLL_S)
    os._exit(1)  # the front end is gone: nobody will read our outputs


def run_engine_core(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    threading.Thread(target=_watch_parent, args=(args.parent_pid,), daemon=True).start()
    ctx = zmq.Context()
    output_queue: queue.Queue = queue.Queue()
    loop_done = threading.Event()  # the busy loop returned: end_if_stuck stands down
    sender = threading.Thread(target=process_output_socket,
                              args=(ctx, args.output, output_queue), name="vllm-core-output")
    sender.start()
    engine_logger = logging.getLogger("libvllm.engine")
    engine_logger.addHandler(_ForwardHandler(output_queue))
    engine_logger.setLevel(args.log_level)
    engine_logger.propagate = False
    relay = LoadProgressRelay(ctx, args.input, output_queue)  # this thread's load reporter
    try:
        from libvllm.engine.engine_core.engine_core import EngineCore

        try:
            core, _ = EngineCore.from_config(EngineConfig(**json.loads(args.config)))
        except Exception as e:  # noqa: BLE001 - the front end reports it
            status = e.status if isinstance(e, VllmError) else 9
            message = str(e) or type(e).__name__
            if not isinstance(e, VllmError):
                message = f"{type(e).__name__}: {message}"
            output_queue.put((FAILED, EngineCoreStartupFailure(status, message)))
            return 1
        proc = EngineCoreProc(core, args.input, args.output, ctx, relay.hand_over())
        if isinstance(core.executor, MultiprocExecutor):
            core.executor.register_failure_callback(
                lambda reason: end_if_stuck(reason, output_queue, sender, ctx, loop_done))
        freeze_gc_heap()
        output_queue.put((READY, core.ready))
        code = proc.run()
    finally:
        relay.close()  # a failed load's socket, before the context ends
        loop_done.set()
        _end_output(output_queue, sender, ctx)
    return code


def _end_output(output_queue: queue.Queue, sender: threading.Thread, ctx: zmq.Context,
                timeout_s: float = 3.0) -> None:
    """End the output thread after what it holds, then flush the context (_flush)."""
    output_queue.put(None)
    sender.join(5)
    _flush(ctx, timeout_s)


def _flush(ctx: zmq.Context, timeout_s: float = 3.0) -> None:
    """Terminate the context, which sends what the closed sockets still queue (LINGER);
    without it the process can exit first. Bounded: a socket still open (a stuck sender)
    would keep zmq_ctx_term waiting."""
    term = threading.Thread(target=ctx.term, daemon=True)
    term.start()
    term.join(timeout_s)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="the libvllm engine-core process")
    p.add_argument("--input", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--config", required=True,
                   help="EngineConfig (the user's intent) as JSON; the core resolves it")
    p.add_argument("--parent-pid", type=int, required=True)
    p.add_argument("--log-level", type=int, default=logging.WARNING)
    return p.parse_args(argv)


if __name__ == "__main__":
    raise SystemExit(run_engine_core())
