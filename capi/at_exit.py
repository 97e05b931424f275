"""Stops libvllm's background loops and engines before the process's exit destructors
run: a C program that returns from main (or calls exit) with a loop running and without
vllm_shutdown must not crash while the loop thread is inside torch and the static
destructors of torch's libraries run (glibc runs exit handlers in reverse order of
registration; torch's are registered when it is loaded).

install(shutdown), called after an engine was created (torch and its libraries are
loaded by then): once per process, registers shutdown (capi.glue's vllm_shutdown body:
every loop stopped and joined, every engine and engine-core process shut down) as a C
exit handler when libvllm started the interpreter (no Python finalization runs in a C
host), else with Python's atexit (a Python host finalizes its interpreter before the C
exit handlers run). Ours (vLLM's LLM engine registers no such hook; a Python host's
interpreter shutdown plays that part).
"""

from __future__ import annotations

import atexit
import ctypes
from collections.abc import Callable

from _libvllm import lib

_EXIT_HANDLER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_installed: list = []  # the handler, kept alive until the process ends


def install(shutdown: Callable[[], object]) -> None:
    if _installed:
        return

    def at_exit(_arg=None) -> None:
        try:
            shutdown()
        except BaseException:  # noqa: BLE001 - the process is ending: nothing may escape
            pass

    if lib.glue_owns_interpreter():
        handler = _EXIT_HANDLER(at_exit)
        ctypes.CDLL(None)["__cxa_atexit"](handler, None, None)
        _installed.append(handler)
    else:
        atexit.register(at_exit)
        _installed.append(at_exit)
