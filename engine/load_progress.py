"""Model-load progress with abort, per tensor: the weight iterators of the loaders
(engine/model_loader/gguf_loader.py, weight_utils.py) pass their tensors through
track(); the C ABI's vllm_engine_create installs the caller's progress callback with
reporting() around the engine's construction (engine/session/session.py).

As llama.cpp's llama_model_loader (progress_callback called per tensor; returning false
aborts the load); vLLM's loaders only show a tqdm bar over the checkpoint shards
(vllm/model_executor/model_loader/weight_utils.py, safetensors_weights_iterator). The
tensors map onto (0, TENSORS_END]; the caller reports 1.0 once the engine is ready
(include/vllm.h: 1 comes once). A reporter returning False raises LoadCancelledError
(VLLM_ERR_CANCELLED) before the next tensor is read. Reporters are per thread; a load in
an engine-core child process reports through engine/engine_core/load_progress_relay.py,
which asks the front end's reporter (current()) at the first and last tensor and once per
1% of the load between them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from libvllm.engine.errors import VllmError

T = TypeVar("T")
TENSORS_END = 0.9  # the rest: moving to the device, the KV cache, warm-up
_local = threading.local()


class LoadCancelledError(VllmError):
    status = 13  # VLLM_ERR_CANCELLED


Reporter = Callable[[float], bool]


@contextmanager
def reporting(reporter: Reporter) -> Iterator[None]:
    """reporter(progress) -> False to abort, for the loads this thread runs inside."""
    previous = install(reporter)
    try:
        yield
    finally:
        install(previous)


def install(reporter: Reporter | None) -> Reporter | None:
    """Makes reporter this thread's (None: none); returns the one it replaces."""
    previous = current()
    _local.reporter = reporter
    return previous


def current() -> Reporter | None:
    """This thread's reporter, if any."""
    return getattr(_local, "reporter", None)


def track(items: Iterable[T], total: int, part: int = 0, parts: int = 1) -> Iterator[T]:
    """items, reporting after each one (part `part` of `parts` equal parts of the load:
    one per checkpoint file); raises LoadCancelledError when the reporter says stop."""
    reporter = current()
    for done, item in enumerate(items, 1):
        yield item
        if reporter is None or total <= 0:
            continue
        progress = TENSORS_END * (part + min(done, total) / total) / parts
        if not reporter(progress):
            raise LoadCancelledError(f"the progress callback returned 0 at {progress:g} "
                                     f"({done} of {total} tensors read): model load aborted")
