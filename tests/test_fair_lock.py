"""engine/fair_lock.py: a thread that re-takes the lock in a tight loop (AsyncLLM's step
loop) lets a waiting thread in at its next yield_to_waiters(); without the yield a plain
RLock can starve the waiter (the flake this lock fixed). Condition variables work on it."""

from __future__ import annotations

import threading
import time

from libvllm.engine.fair_lock import FairRLock


def _hog(lock: FairRLock, stop: threading.Event, fair: bool, steps: list) -> None:
    while not stop.is_set():
        with lock:
            time.sleep(0.002)  # one "step"
            steps.append(1)
        if fair:
            lock.yield_to_waiters()


def test_a_waiter_gets_the_lock_at_the_next_step():
    lock, stop, steps = FairRLock(), threading.Event(), []
    hog = threading.Thread(target=_hog, args=(lock, stop, True, steps))
    hog.start()
    time.sleep(0.02)
    try:
        for _ in range(20):
            before = len(steps)
            with lock:
                waited = len(steps) - before
            assert waited <= 2, waited
    finally:
        stop.set()
        hog.join()


def test_reentrant_and_condition_compatible():
    lock = FairRLock()
    with lock, lock:
        assert lock._is_owned()
    cond, ready = threading.Condition(lock), []

    def notify():
        with cond:
            ready.append(1)
            cond.notify()

    with cond:
        threading.Thread(target=notify).start()
        assert cond.wait_for(lambda: ready, timeout=5)
    assert not lock._is_owned()
    assert lock.acquire(blocking=False)
    lock.release()
