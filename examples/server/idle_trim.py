"""Gives freed heap memory back to the OS once the server is idle.

After a burst of large requests (32 MB bodies, big prompts, grammar compiles) the memory
is freed but glibc keeps it in its per-thread arenas, so the idle server's RSS stays at
the burst's peak. IdleTrim calls malloc_trim(0) on a worker thread IDLE_S seconds after the
last request in flight ended (a new request cancels the pending trim); limit_arenas caps
the number of arenas. Both are no-ops where the C library lacks them.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import threading

IDLE_S = 1.0
MAX_ARENAS = 4  # glibc's default is 8 per core: a burst on many threads fragments them all
_M_ARENA_MAX = -8  # mallopt's parameter number (malloc.h)


def _libc_function(name: str):
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):
        return None


_malloc_trim = _libc_function("malloc_trim")


def limit_arenas() -> None:
    """Caps glibc's malloc arenas (as MALLOC_ARENA_MAX would); call before threads start.
    A set MALLOC_ARENA_MAX wins."""
    mallopt = _libc_function("mallopt")
    if mallopt is not None and "MALLOC_ARENA_MAX" not in os.environ:
        mallopt(_M_ARENA_MAX, MAX_ARENAS)


class IdleTrim:
    def __init__(self) -> None:
        self._pending: asyncio.TimerHandle | None = None

    def busy(self) -> None:
        """A request started: no trim while it runs."""
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None

    def idle(self) -> None:
        """The last request in flight ended (call on the event loop)."""
        if _malloc_trim is None:
            return
        self.busy()
        self._pending = asyncio.get_running_loop().call_later(IDLE_S, self._trim)

    def _trim(self) -> None:
        self._pending = None
        threading.Thread(target=_malloc_trim, args=(0,), name="vllm-malloc-trim",
                         daemon=True).start()
