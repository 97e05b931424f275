"""Structured-output helpers: timed regex conversion, grammar sniffing, the compiled-grammar
LRU (bounded in entries and bytes), and applying a packed token bitmask to a logits batch.

Mirrors vllm/v1/structured_output/utils.py (`compile_regex_with_timeout`,
`grammar_is_likely_lark`, `choice_as_grammar`, `apply_grammar_bitmask`). Our
`apply_grammar_bitmask` takes the logits row of each bitmask row directly (the runner knows
them) instead of re-deriving them from the scheduler output.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TypeVar

import regex as re
import torch

from libvllm.engine.errors import InvalidArgumentError

_T = TypeVar("_T")


def compile_regex_with_timeout(fn: Callable[[str], _T], pattern: str, timeout: float) -> _T:
    """Run `fn(pattern)` with a time limit (ReDoS guard); 0 disables the limit."""
    if timeout <= 0:
        return fn(pattern)
    executor = ThreadPoolExecutor(max_workers=1)
    future = executor.submit(fn, pattern)
    try:
        return future.result(timeout=timeout)
    except FutureTimeout:
        raise InvalidArgumentError(
            f"Regex compilation timed out after {timeout}s. "
            "The pattern may be too complex or contain constructs that "
            "cause exponential state-space explosion (e.g. nested "
            f"quantifiers). Pattern: {pattern[:200]}"
        ) from None
    finally:
        executor.shutdown(wait=False, cancel_futures=True)


def grammar_is_likely_lark(grammar_str: str) -> bool:
    """True unless some line (comments stripped) defines a rule with `::=` (EBNF/GBNF)."""
    if not grammar_str or not isinstance(grammar_str, str):
        return False
    for line in grammar_str.split("\n"):
        line = re.sub(r"(#|//).*$", "", line).strip()
        if "::=" in line:
            return False
    return True


def choice_as_grammar(choice: list[str]) -> str:
    """An EBNF grammar accepting exactly one of `choice` (literals escaped)."""
    escapes = {"\\": r"\\", '"': r"\"", "\n": r"\n", "\r": r"\r", "\t": r"\t"}

    def escape_char(ch: str) -> str:
        if ch in escapes:
            return escapes[ch]
        if ord(ch) < 0x20 or ord(ch) == 0x7F:
            return f"\\u{ord(ch):04x}"
        return ch

    literals = ('"' + "".join(escape_char(ch) for ch in c) + '"' for c in choice)
    return "root ::= " + " | ".join(literals)


class CompiledGrammarCache:
    """Thread-safe LRU of compiled grammars keyed by (kind, spec), bounded by its number of
    entries and by the bytes size_of counts (an entry larger than max_bytes is not kept)."""

    def __init__(self, maxsize: int, max_bytes: int, size_of: Callable[[object], int]) -> None:
        self.maxsize, self.max_bytes, self.size_of = maxsize, max_bytes, size_of
        self._entries: OrderedDict[object, tuple[object, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.nbytes = 0

    def get_or_compile(self, key: object, compile_fn: Callable[[], _T]) -> _T:
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                self.hits += 1
                return self._entries[key][0]  # type: ignore[return-value]
        value = compile_fn()  # outside the lock: compiles run in parallel
        size = self.size_of(value) + self.size_of(key)
        if self.maxsize and size <= self.max_bytes:
            with self._lock:
                old = self._entries.pop(key, None)
                self.nbytes += size - (old[1] if old else 0)
                self._entries[key] = (value, size)
                while len(self._entries) > self.maxsize or self.nbytes > self.max_bytes:
                    self.nbytes -= self._entries.popitem(last=False)[1][1]
        return value


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """int32 [n, W] packed bits -> bool [n, vocab_size] (tokens past 32*W disallowed)."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    allowed = ((bitmask.unsqueeze(-1) >> shifts) & 1).reshape(bitmask.shape[0], -1).bool()
    if allowed.shape[1] < vocab_size:
        allowed = torch.nn.functional.pad(allowed, (0, vocab_size - allowed.shape[1]))
    return allowed[:, :vocab_size]


def apply_grammar_bitmask(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    rows: Sequence[int] | torch.Tensor | None = None,
) -> None:
    """Set disallowed logits to -inf in place, for the whole batch at once.

    logits: [B, V] on any device. bitmask: int32 [n, ceil(V/32)] (CPU; pinned for an async
    copy). rows: the logits row of each bitmask row (n of them; a device LongTensor avoids a
    host->device copy), or None when n == B and rows line up. No host sync on GPU.
    """
    if bitmask.shape[0] == 0:
        return
    if logits.is_cpu and logits.dtype == torch.float32 and bitmask.is_cpu:
        import xgrammar as xgr  # its CPU kernel; the torch path below is equivalent

        if rows is None:
            xgr.apply_token_bitmask_inplace(logits, bitmask)
            return
        index = torch.as_tensor(rows, dtype=torch.long)
        aligned = bitmask.new_full((logits.shape[0], bitmask.shape[1]), -1)  # its rows = logits'
        aligned[index] = bitmask
        xgr.apply_token_bitmask_inplace(logits, aligned, indices=index.tolist())
        return
    allowed = unpack_bitmask(bitmask.to(logits.device, non_blocking=True), logits.shape[-1])
    if rows is None:
        logits.masked_fill_(~allowed, float("-inf"))
        return
    index = torch.as_tensor(rows, dtype=torch.long).to(logits.device, non_blocking=True)
    masked = logits.index_select(0, index).masked_fill_(~allowed, float("-inf"))
    logits.index_copy_(0, index, masked)
