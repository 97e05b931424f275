"""MergedStream: the outputs of several engine requests (n choices x prompts) as one stream.

Mirrors vllm/utils/async_utils.py::merge_async_iterators, with threads instead of asyncio:
one request is read directly; several are pumped by one daemon thread each into a queue.
Yields (choice index, prompt index, RequestOutput); EOFError once every request finished.
"""

from __future__ import annotations

import queue
import threading
import time

_POLL_S = 0.5  # how often a pump re-checks that the merged stream was not closed


class MergedStream:
    def __init__(self, streams: list[tuple[int, int, object]]) -> None:
        self._streams = streams  # (choice index, prompt index, RequestStream)
        self._open = len(streams)
        self._closed = threading.Event()
        self._queue: queue.Queue | None = None
        if len(streams) > 1:
            self._queue = queue.Queue()
            for entry in streams:
                threading.Thread(target=self._pump, args=(entry,), daemon=True,
                                 name="openai-stream-pump").start()

    def _pump(self, entry: tuple[int, int, object]) -> None:
        index, prompt_idx, stream = entry
        while not self._closed.is_set():
            try:
                out = stream.get(_POLL_S)
            except EOFError:
                break
            except BaseException as exc:  # handed to the reader, which raises it
                self._queue.put(exc)
                return
            if out is not None:
                self._queue.put((index, prompt_idx, out))
        self._queue.put(EOFError)

    def get(self, timeout_s: float | None):
        """The next (choice, prompt, output); None on timeout; EOFError when all finished."""
        if self._queue is None:
            index, prompt_idx, stream = self._streams[0]
            out = stream.get(timeout_s)
            return None if out is None else (index, prompt_idx, out)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self._open:
            try:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                item = self._queue.get(timeout=left)
            except queue.Empty:
                return None
            if item is EOFError:
                self._open -= 1
                continue
            if isinstance(item, BaseException):
                raise item
            return item
        raise EOFError

    def items(self, clock):
        """get() bounded by clock (a StreamClock) until every request finished: each
        (choice, prompt, output), or None when the clock ran out first."""
        while True:
            try:
                yield self.get(clock.remaining())
            except EOFError:
                return

    def cancel(self) -> None:
        """Aborts every request that has not finished."""
        for _, _, stream in self._streams:
            stream.cancel()

    def close(self) -> None:
        """Cancels and stops the pump threads."""
        self.cancel()
        self._closed.set()
