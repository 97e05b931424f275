"""Load progress with abort across the engine-core process boundary: the child's loader
reports per tensor (engine/load_progress.py's track()); the relay passes the first
tensor's progress, then one whenever the load has gone REPORT_STEP (1%) past the last
one passed, and the last tensor's (TENSORS_END), to the front end's reporter, which can
stop the load at any of them before the next tensor is read, as in process. A load of
any tensor count thus makes at most 1 / REPORT_STEP + 2 round trips
(tests/test_load_progress_relay.py counts them), not one per tensor.

Ours: vLLM's EngineCoreProc (vllm/v1/engine/core.py) sends nothing before its READY
handshake, and its loaders only draw a tqdm bar (model_loader/weight_utils.py). The
protocol, one round trip per progress passed before READY:
- the child sends PROGRESS + the progress (a float) on its output socket, behind the log
  records before it, and waits;
- the front end answers on the input socket: LOAD_CONTINUE, LOAD_ABORT (its reporter
  returned False: the child's track() raises LoadCancelledError, which comes back as
  FAILED with VLLM_ERR_CANCELLED and the tensor count), or LOAD_UNWATCHED (it has no
  reporter: the child goes on and sends no more PROGRESS).
The front end sends nothing else on the input socket before READY, so the load's PULL
socket is the one the child's input thread goes on reading (a second PULL on the same
address would take a share of the front end's messages).
"""

from __future__ import annotations

import queue

import zmq

from libvllm.engine import load_progress
from libvllm.engine.engine_core.engine_core_utils import (
    LOAD_ABORT,
    LOAD_CONTINUE,
    LOAD_UNWATCHED,
    PROGRESS,
)
from libvllm.engine.errors import VllmError
from libvllm.engine.load_progress import TENSORS_END

REPORT_STEP = 0.01  # the least progress between two values passed to the front end


class LoadProgressRelay:
    """The child's reporter, installed on the loading thread from construction to
    hand_over() (the load succeeded) or close() (it failed)."""

    def __init__(self, ctx: zmq.Context, input_address: str, output_queue: queue.Queue) -> None:
        self.socket: zmq.Socket | None = ctx.socket(zmq.PULL)
        self.socket.connect(input_address)
        self.output_queue = output_queue  # (tag, obj) items of the output thread
        self.watched = True
        self.passed: float | None = None  # the last progress the front end was asked about
        self.previous = load_progress.install(self)

    def __call__(self, progress: float) -> bool:
        if not self.watched:
            return True
        if self.passed is not None and (progress <= self.passed or (
                progress - self.passed < REPORT_STEP and progress < TENSORS_END)):
            return True  # a repeat, or within REPORT_STEP of the last value passed: not asked
        self.passed = progress
        self.output_queue.put((PROGRESS, progress))
        answer = self.socket.recv()
        if answer not in (LOAD_CONTINUE, LOAD_ABORT, LOAD_UNWATCHED):
            raise VllmError(f"unexpected message from the front end during the load: "
                            f"{answer[:32]!r}")
        self.watched = answer != LOAD_UNWATCHED
        return answer != LOAD_ABORT

    def hand_over(self) -> zmq.Socket:
        """The loaded engine's input socket; the reporter is uninstalled."""
        load_progress.install(self.previous)
        socket, self.socket = self.socket, None
        return socket

    def close(self) -> None:
        """After a failed load: uninstalls and closes the socket (so the context can end)."""
        if self.socket is not None:
            load_progress.install(self.previous)
            self.socket.close(linger=0)
            self.socket = None


def answer(reporter: load_progress.Reporter | None, progress: float) -> bytes:
    """The front end's answer to PROGRESS: its reporter's verdict, LOAD_UNWATCHED without
    one. An exception of the reporter propagates (the front end stops the child)."""
    if reporter is None:
        return LOAD_UNWATCHED
    return LOAD_CONTINUE if reporter(progress) else LOAD_ABORT
