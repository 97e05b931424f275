"""SyncMPClient: the engine core in a child process, as vllm/v1/engine/core_client.py
(MPClient: sockets, start-up handshake, ensure_alive, the process monitor that turns a
dead core into EngineDeadError; SyncMPClient: an output thread feeding a queue;
call_utility / UtilityOutput).

The start-up wait answers the child's load progress (PROGRESS frames before READY) with
this thread's load_progress reporter (engine/engine_core/load_progress_relay.py): the
progress callback of vllm_engine_create sees the first and last tensor and one value per
1% of the load, and its abort stops the child's load before the next tensor
(LoadCancelledError, as in process).

vLLM's AsyncMPClient is asyncio; our AsyncLLM is threaded (the C ABI and the HTTP
server call it from OS threads), so it uses this client too: its loop blocks in
get_output without the engine lock. Sockets: the front end binds a PUSH (input) and a
PULL (output) IPC socket, the child connects. Sends never block forever (a PUSH to a
dead peer would): they wait in short slices and give up once the child is dead. The
output thread polls the socket and, when it is quiet, the child (Popen.poll reaps it):
a dead child ends every get_output and call with EngineDeadError within ~0.1 s, and
check_health (vLLM's) raises it with no request in flight.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from concurrent.futures import Future

import msgspec
import zmq

from libvllm.engine import envs
from libvllm.engine.config import EngineConfig
from libvllm.engine.engine_core.core_client import EngineCoreClient
from libvllm.engine.engine_core.engine_core_messages import (
    EngineCoreOutputs,
    EngineCoreReady,
    EngineCoreRequest,
    EngineCoreRequestType,
    EngineCoreStartupFailure,
    error_from_wire,
)
from libvllm.engine.engine_core.engine_core_utils import (
    DEAD,
    FAILED,
    LOAD_ABORT,
    PROGRESS,
    READY,
    CoreProcess,
    ipc_addresses,
    launch_core_process,
)
from libvllm.engine.engine_core.load_progress_relay import answer
from libvllm.engine.errors import VllmError
from libvllm.engine.exceptions import INVALID_STATE, EngineDeadError
from libvllm.engine.load_progress import LoadCancelledError, Reporter, current
from libvllm.engine.process_utils import describe_exit
from libvllm.engine.serial_utils import MsgpackDecoder, MsgpackEncoder

_POLL_MS = 100
_SHUTDOWN_WAIT_S = 5.0
READY_TIMEOUT_S = envs.VLLM_ENGINE_READY_TIMEOUT_S
logger = logging.getLogger(__name__)


class SyncMPClient(EngineCoreClient):
    is_multiprocess = True

    def __init__(self, config: EngineConfig) -> None:
        self.ctx = zmq.Context()
        ipc_dir, input_address, output_address = ipc_addresses()
        self.input_socket = self.ctx.socket(zmq.PUSH)
        self.input_socket.setsockopt(zmq.SNDTIMEO, _POLL_MS)
        self.input_socket.bind(input_address)
        self.output_socket = self.ctx.socket(zmq.PULL)
        self.output_socket.bind(output_address)
        self.encoder = MsgpackEncoder()
        self.decoder = MsgpackDecoder(EngineCoreOutputs)
        self.outputs_queue: queue.Queue = queue.Queue()
        self.send_lock = threading.Lock()
        self.utility_results: dict[int, Future] = {}
        self.call_ids = itertools.count()
        self.dead: EngineDeadError | None = None
        self.closing = False
        self.core: CoreProcess | None = None
        try:
            self.core = launch_core_process(config, ipc_dir, input_address, output_address)
            self.ready = self._wait_for_ready()
        except BaseException:
            self.shutdown()
            raise
        self.output_thread = threading.Thread(target=self._process_outputs_socket,
                                              name="vllm-core-client-output", daemon=True)
        self.output_thread.start()

    # ---------------------------------------------------------------- start-up

    def _wait_for_ready(self) -> EngineCoreReady:
        """The child's handshake; its start-up failure as the exception it had. Log
        records and load progress of the start-up come first."""
        reporter = current()  # the caller's: vllm_engine_create's progress callback
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if not self.output_socket.poll(_POLL_MS):
                code = self.core.proc.poll()
                if code is not None:
                    raise VllmError(f"the engine core process died during start-up "
                                    f"({describe_exit(code)})")
                if time.monotonic() > deadline:
                    raise VllmError(f"the engine core did not start within "
                                    f"{READY_TIMEOUT_S:.0f} s (VLLM_ENGINE_READY_TIMEOUT_S)")
                continue
            frames = self.output_socket.recv_multipart()
            if frames[0] == READY:
                return msgspec.msgpack.decode(frames[1], type=EngineCoreReady)
            if frames[0] == PROGRESS:
                self._answer_load(reporter, msgspec.msgpack.decode(frames[1], type=float))
                continue
            if frames[0] == FAILED:
                failure = msgspec.msgpack.decode(frames[1], type=EngineCoreStartupFailure)
                if failure.status == LoadCancelledError.status:
                    raise LoadCancelledError(failure.message)
                raise error_from_wire((failure.status, failure.message))
            outputs = self.decoder.decode(frames)
            if outputs.log_record is not None:
                _emit_log(outputs.log_record)

    def _answer_load(self, reporter: Reporter | None, progress: float) -> None:
        """The reporter's answer, which the child waits for; LOAD_ABORT when the reporter
        raises (then the exception goes on, and the child's load ends at once). A dead
        child is seen by the next poll."""
        frame = LOAD_ABORT
        try:
            frame = answer(reporter, progress)
        finally:
            self._send_load_answer(frame)

    def _send_load_answer(self, frame: bytes) -> None:
        while self.core.proc.poll() is None:
            try:
                self.input_socket.send(frame)
                return
            except zmq.Again:  # not connected yet: look again
                continue

    # ---------------------------------------------------------------- outputs

    def _process_outputs_socket(self) -> None:
        sock, proc = self.output_socket, self.core.proc
        while not self.closing:
            if not sock.poll(_POLL_MS):
                code = proc.poll()  # reaps the child: no zombie
                if code is not None and not self.closing:
                    self._die(f"the engine core process died ({describe_exit(code)})")
                    return
                continue
            frames = sock.recv_multipart(copy=False)
            if bytes(frames[0].buffer) == DEAD:
                self._die(msgspec.msgpack.decode(frames[1].buffer))
                return
            try:
                outputs = self.decoder.decode([f.buffer for f in frames])
            except (msgspec.DecodeError, TypeError, ValueError) as e:
                self._die(f"undecodable output from the engine core: {e}")
                _stop(proc)
                return
            if outputs.log_record is not None:
                _emit_log(outputs.log_record)
            elif outputs.utility_output is not None:
                self._resolve_utility(outputs.utility_output)
            else:
                self.outputs_queue.put(outputs)

    def _resolve_utility(self, out) -> None:
        future = self.utility_results.pop(out.call_id, None)
        if future is None:
            return
        if out.failure is not None:
            future.set_exception(VllmError(f"engine core utility call failed: {out.failure}"))
        else:
            future.set_result(out.result)

    def _die(self, reason: str) -> None:
        self.dead = EngineDeadError(f"engine dead: {reason}", INVALID_STATE, INVALID_STATE)
        self.outputs_queue.put(self.dead)
        for future in list(self.utility_results.values()):
            future.set_exception(self.dead)
        self.utility_results.clear()

    def get_output(self, timeout_s: float | None = None) -> EngineCoreOutputs | None:
        try:
            item = self.outputs_queue.get(timeout=timeout_s)
        except queue.Empty:
            return None
        if isinstance(item, BaseException):
            self.outputs_queue.put(item)  # every later call sees it too
            raise item
        return item

    def wakeup(self) -> None:
        self.outputs_queue.put(None)

    def check_health(self) -> None:
        """EngineDeadError once the child died: as seen by the output thread (vLLM's
        process monitor), or by a look at the child now, so that a probe right after the
        kill needs no other request and no wait for the thread's next poll."""
        self._ensure_alive()
        code = self.core.proc.poll() if self.core is not None else None
        if code is not None:
            raise EngineDeadError(
                f"engine dead: the engine core process died ({describe_exit(code)})",
                INVALID_STATE, INVALID_STATE)

    # ---------------------------------------------------------------- inputs

    def _send(self, kind: EngineCoreRequestType, obj: object = None) -> None:
        frames = [kind.value] + ([] if obj is None else self.encoder.encode(obj))
        with self.send_lock:
            while True:
                self._ensure_alive()
                try:
                    self.input_socket.send_multipart(frames, copy=False)
                    return
                except zmq.Again:  # the child is busy or gone: look again
                    continue

    def _ensure_alive(self) -> None:
        if self.dead is not None:
            raise self.dead
        if self.closing:
            raise EngineDeadError("the engine core is shut down", INVALID_STATE, INVALID_STATE)

    def add_request(self, request: EngineCoreRequest) -> None:
        self._send(EngineCoreRequestType.ADD, request)

    def abort_requests(self, request_ids: list[str]) -> None:
        if request_ids and self.dead is None:
            self._send(EngineCoreRequestType.ABORT, list(request_ids))

    def call_utility(self, method: str, *args, result_type: type) -> object:
        future: Future = Future()
        call_id = next(self.call_ids)
        self.utility_results[call_id] = future
        self._send(EngineCoreRequestType.UTILITY, (call_id, method, list(args)))
        while True:
            try:
                raw = future.result(timeout=_POLL_MS / 1000)
                return msgspec.msgpack.decode(raw, type=result_type)
            except TimeoutError:
                self._ensure_alive()

    def make_stats(self) -> EngineCoreOutputs:
        return self.call_utility("make_stats", result_type=EngineCoreOutputs)

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        return self.call_utility("reset_prefix_cache", reset_running_requests, result_type=bool)

    def peak_memory_bytes(self) -> int:
        return self.call_utility("peak_memory_bytes", result_type=int)

    # ---------------------------------------------------------------- shutdown

    def shutdown(self) -> None:
        """Ask the child to stop, then SIGTERM, then SIGKILL; reap it; close the sockets."""
        if self.closing:
            return
        started = self.core is not None and hasattr(self, "output_thread")
        if started and self.dead is None and self.core.proc.poll() is None:
            try:
                self._send(EngineCoreRequestType.SHUTDOWN)
            except EngineDeadError:
                pass
        self.closing = True
        if self.core is not None:
            _stop(self.core.proc)
            self.core.cleanup()
        if started:
            self.output_thread.join(10 * _POLL_MS / 1000)
        self.input_socket.close(linger=0)
        self.output_socket.close(linger=0)
        self.ctx.term()


def _stop(proc) -> None:
    for signal_it in (None, proc.terminate, proc.kill):
        if signal_it is not None:
            signal_it()
        try:
            proc.wait(_SHUTDOWN_WAIT_S)
            return
        except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired: escalate
            continue


def _emit_log(log_record: tuple[int, str, str]) -> None:
    level, name, message = log_record
    target = logging.getLogger(name)
    if target.isEnabledFor(level):
        target.handle(target.makeRecord(name, level, "(engine core)", 0, message, (), None))
