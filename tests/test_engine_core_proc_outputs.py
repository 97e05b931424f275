"""The engine-core child's busy loop sends each step's outputs itself
(engine/engine_core/engine_core_proc.py EngineCoreProc.send_output).

vLLM 0.33's EngineCoreProc queues them for its output thread (vllm/v1/engine/core.py
process_output_sockets); here a thread woken every step took the GIL from the loop in the
middle of the next forward, which made eager decode slower in the child than in process,
so the loop encodes and sends on its own PUSH socket and the output thread only carries
the handshake, log records and the DEAD frame. Checked with a stand-in core (no model):
the outputs of every step and a utility result arrive in order on the front end's PULL
socket, and the busy loop puts nothing on any queue (no other thread is woken).
"""

from __future__ import annotations

import queue
import threading

import pytest
import zmq

from libvllm.engine.engine_core.engine_core_messages import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequestType,
)
from libvllm.engine.engine_core.engine_core_proc import EngineCoreProc
from libvllm.engine.serial_utils import MsgpackDecoder, MsgpackEncoder


class _StandInCore:
    """Steps `steps` times, one token each; make_stats answers."""

    batch_queue = ()

    def __init__(self, steps: int) -> None:
        self.left = steps

    def has_work(self) -> bool:
        return self.left > 0

    def step(self) -> EngineCoreOutputs:
        self.left -= 1
        return EngineCoreOutputs([EngineCoreOutput("r", [self.left])])

    def make_stats(self) -> EngineCoreOutputs:
        return EngineCoreOutputs([])


@pytest.fixture
def sockets(tmp_path):
    ctx = zmq.Context()
    push, pull = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    push.bind(f"ipc://{tmp_path}/input")
    pull.bind(f"ipc://{tmp_path}/output")
    pull.setsockopt(zmq.RCVTIMEO, 5000)
    yield ctx, push, pull, f"ipc://{tmp_path}/input", f"ipc://{tmp_path}/output"
    push.close(linger=0)
    pull.close(linger=0)
    ctx.term()


def _recv(pull) -> EngineCoreOutputs:
    return MsgpackDecoder(EngineCoreOutputs).decode(pull.recv_multipart())


def test_busy_loop_sends_step_outputs_without_the_output_thread(sockets, monkeypatch):
    ctx, push, pull, input_address, output_address = sockets
    proc = EngineCoreProc(_StandInCore(5), input_address, output_address, ctx)
    loop = threading.Thread(target=proc.run_busy_loop, daemon=True)
    woken: list = []  # items the busy loop handed to another thread
    put = queue.Queue.put

    def spy(self, item, *args, **kwargs):
        if threading.current_thread() is loop:
            woken.append(item)
        return put(self, item, *args, **kwargs)

    monkeypatch.setattr(queue.Queue, "put", spy)
    loop.start()
    try:
        tokens = [_recv(pull).outputs[0].new_token_ids for _ in range(5)]
        assert tokens == [[4], [3], [2], [1], [0]]
        encoder = MsgpackEncoder()
        push.send_multipart([EngineCoreRequestType.UTILITY.value,
                             *encoder.encode((7, "make_stats", []))])
        utility = _recv(pull).utility_output
        assert utility.call_id == 7 and utility.failure is None
    finally:
        push.send_multipart([EngineCoreRequestType.SHUTDOWN.value])
        loop.join(5)
        proc.close()
    assert not loop.is_alive()
    assert woken == []


class _FailingCore(_StandInCore):
    """Two steps of outputs, then a step that raises."""

    def step(self) -> EngineCoreOutputs:
        if self.left == 1:
            raise RuntimeError("boom")
        return super().step()


def test_dead_goes_out_after_the_last_steps_outputs(sockets):
    """A failing step: the earlier steps' outputs, the traceback record, then DEAD, in that
    order on the front end's PULL even when it reads late (the front end stops at DEAD).
    On the output thread's socket, DEAD could overtake the loop's outputs."""
    import time

    from libvllm.engine.engine_core.engine_core_proc import DEAD

    ctx, push, pull, input_address, output_address = sockets
    proc = EngineCoreProc(_FailingCore(3), input_address, output_address, ctx)
    assert proc.run() == 1
    time.sleep(0.2)  # the front end lags behind
    got = []
    while pull.poll(200):
        frames = pull.recv_multipart()
        if frames[0] == DEAD:
            got.append(("DEAD", MsgpackDecoder(str).decode(frames[1:])))
            continue
        out = MsgpackDecoder(EngineCoreOutputs).decode(frames)
        got.append(out.log_record[2].splitlines()[0] if out.log_record
                   else out.outputs[0].new_token_ids)
    assert got == [[2], [1], "the engine core failed",
                   ("DEAD", "the engine core failed: RuntimeError: boom")]


def test_worker_death_with_a_stuck_loop_sends_dead_and_ends(tmp_path):
    """end_if_stuck (the tensor-parallel executor's failure callback in the child): a busy
    loop held in a collective with the dead peer (its socket still open) still gets DEAD +
    the reason to the front end, and the process exits 1. In a real process, three times:
    without the context flush, DEAD was lost in 11 of 40 exits (before the flush)."""
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    from libvllm.engine.engine_core.engine_core_proc import DEAD, READY

    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.RCVTIMEO, 30000)
    for i in range(3):
        address = f"ipc://{tmp_path}/out{i}"
        pull.bind(address)
        child = textwrap.dedent(f"""
            import queue, threading, zmq
            from libvllm.engine.engine_core import engine_core_proc as ecp
            ecp._STUCK_GRACE_S = 0.0
            ctx = zmq.Context()
            q = queue.Queue()
            sender = threading.Thread(target=ecp.process_output_socket, args=(ctx, {address!r}, q))
            sender.start()
            stuck = ctx.socket(zmq.PUSH)  # the busy loop's socket, never closed
            stuck.connect({address!r})
            q.put((ecp.READY, "ready"))
            ecp.end_if_stuck("worker pid 7 died", q, sender, ctx, threading.Event())
        """)
        done = subprocess.run([sys.executable, "-c", child], timeout=120,
                              cwd=Path(__file__).resolve().parents[1])
        assert done.returncode == 1
        assert pull.recv_multipart()[0] == READY
        frames = pull.recv_multipart()
        assert frames[0] == DEAD and MsgpackDecoder(str).decode(frames[1:]) == (
            "the engine core failed: worker pid 7 died")
        pull.unbind(address)
    pull.close(linger=0)
    ctx.term()


def test_stuck_check_stands_down_once_the_loop_has_ended():
    """The loop returned (its own DEAD or a shutdown went out): the callback does nothing."""
    from libvllm.engine.engine_core.engine_core_proc import end_if_stuck

    output_queue: queue.Queue = queue.Queue()
    loop_done = threading.Event()
    loop_done.set()
    end_if_stuck("worker pid 7 died", output_queue, threading.Thread(), zmq.Context(),
                 loop_done)
    assert output_queue.empty()
