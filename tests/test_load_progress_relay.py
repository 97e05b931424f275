"""The engine-core child's load-progress relay (engine/engine_core/load_progress_relay.py)
over a real zmq socket pair in this process: a load of many tensors makes a bounded
number of round trips (at most one per 1% of the load, plus the first and the last
tensor), and a reporter returning False part way stops the load before the next tensor,
with no report after it. The front end here is a thread that answers each PROGRESS as
core_client_mp.py's start-up wait does (load_progress_relay.answer).

Oracle: include/vllm.h (the callback's 0 aborts the load: VLLM_ERR_CANCELLED), the item
count of the load itself.
"""

from __future__ import annotations

import queue
import threading

import pytest
import zmq

from libvllm.engine import load_progress
from libvllm.engine.engine_core.engine_core_utils import PROGRESS
from libvllm.engine.engine_core.load_progress_relay import LoadProgressRelay, answer
from libvllm.engine.load_progress import TENSORS_END, LoadCancelledError, track

N = 5000  # tensors of the load: many more than the round trips allowed
MAX_ROUND_TRIPS = 100 + 2  # one per 1% of the load, the first and the last tensor


class FrontEnd:
    """A socket pair and a thread answering the relay's PROGRESS items with reporter."""

    def __init__(self, reporter: load_progress.Reporter | None) -> None:
        self.ctx = zmq.Context()
        self.push = self.ctx.socket(zmq.PUSH)
        address = "inproc://load-progress-test"
        self.push.bind(address)
        self.output: queue.Queue = queue.Queue()
        self.relay = LoadProgressRelay(self.ctx, address, self.output)
        self.reporter = reporter
        self.frames = 0  # PROGRESS items the relay sent
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while (item := self.output.get()) is not None:
            tag, progress = item
            assert tag == PROGRESS
            self.frames += 1
            self.push.send(answer(self.reporter, progress))

    def close(self) -> None:
        self.output.put(None)
        self.thread.join(5)
        self.relay.close()
        self.push.close(linger=0)
        self.ctx.term()


def _load(front: FrontEnd, n: int = N, counted: int | None = None) -> list[int]:
    """The items a load of n tensors (track() told `counted`, default n) reads under the
    relay."""
    read = []
    try:
        for item in track(range(n), counted or n):
            read.append(item)
    finally:
        front.close()
    return read


def test_many_tensors_make_a_bounded_number_of_round_trips():
    seen: list[float] = []
    front = FrontEnd(lambda p: seen.append(p) or True)
    assert _load(front) == list(range(N))
    assert front.frames == len(seen) <= MAX_ROUND_TRIPS
    assert seen[0] == pytest.approx(TENSORS_END / N)  # the first tensor is reported
    assert seen[-1] == pytest.approx(TENSORS_END)  # and the last
    gaps = [b - a for a, b in zip(seen, seen[1:])]
    assert all(g >= 0.01 - 1e-9 for g in gaps[:-1]) and all(g > 0 for g in gaps)


def test_a_load_yielding_more_items_than_counted_asks_once_at_the_end():
    """A loader yielding more items than track() counted (two tensors from one fused GGUF
    expert) holds at TENSORS_END: those repeats make no round trip."""
    seen: list[float] = []
    front = FrontEnd(lambda p: seen.append(p) or True)
    assert _load(front, counted=N // 2) == list(range(N))
    assert front.frames == len(seen) <= MAX_ROUND_TRIPS
    assert seen.count(pytest.approx(TENSORS_END)) == 1


def test_abort_part_way_stops_before_the_next_tensor():
    seen: list[float] = []
    front = FrontEnd(lambda p: seen.append(p) or p < 0.45)
    with pytest.raises(LoadCancelledError) as info:
        _load(front)
    assert seen[-1] >= 0.45 and all(p < 0.45 for p in seen[:-1])  # no report after it
    read = round(seen[-1] / TENSORS_END * N)
    assert N / 2 <= read <= (0.45 + 0.01) / TENSORS_END * N  # within 1% past it
    assert f"({read} of {N} tensors read)" in str(info.value)
    assert front.frames == len(seen) <= MAX_ROUND_TRIPS // 2 + 1
    assert info.value.status == 13  # VLLM_ERR_CANCELLED


def test_an_unwatched_load_sends_one_progress_only():
    front = FrontEnd(None)  # no reporter: LOAD_UNWATCHED at the first PROGRESS
    assert _load(front) == list(range(N))
    assert front.frames == 1
