"""FairRLock: the engine lock, a reentrant lock whose holder can see that others wait.

AsyncLLM's loop thread takes the lock for one step, releases it and takes it again for
the next. A plain RLock lets it win that race against threads already waiting (an add,
an abort, a stats read), so they can starve for many steps. The loop calls
`yield_to_waiters()` between steps: while a thread waits for the lock it steps aside until
that thread has had it. Ours (vLLM's engine core runs in its own process and has no such
lock); works with threading.Condition like an RLock.
"""

from __future__ import annotations

import threading


class FairRLock:
    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._count_lock = threading.Lock()
        self._waiting = 0
        self._turn = threading.Condition(self._count_lock)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._lock.acquire(blocking=False):
            return True
        if not blocking:
            return False
        with self._count_lock:
            self._waiting += 1
        try:
            return self._lock.acquire(True, timeout)
        finally:
            with self._count_lock:
                self._waiting -= 1
                self._turn.notify_all()

    def release(self) -> None:
        self._lock.release()

    __enter__ = acquire

    def __exit__(self, *exc) -> None:
        self.release()

    def yield_to_waiters(self, timeout_s: float = 0.05) -> None:
        """Called without holding the lock: returns once no thread waits for it (or after
        timeout_s, so a waiter that gave up cannot stall the caller)."""
        with self._count_lock:
            self._turn.wait_for(lambda: self._waiting == 0, timeout_s)

    # threading.Condition(FairRLock()) uses the RLock protocol of the inner lock
    def _is_owned(self) -> bool:
        return self._lock._is_owned()

    def _release_save(self):
        return self._lock._release_save()

    def _acquire_restore(self, state) -> None:
        self._lock._acquire_restore(state)
