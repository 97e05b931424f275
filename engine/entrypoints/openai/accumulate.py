"""Pieces shared by the streaming and the non-streaming paths of both generation endpoints.

FinalOutput: one choice's DELTA outputs joined (vLLM's FINAL_ONLY RequestOutput);
StreamClock: the deadline one ChunkStream.get call gives the generator it drives;
include_usage: vllm/entrypoints/serve/utils/api_utils.py::should_include_usage.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class FinalOutput:
    prompt_idx: int
    prompt_token_ids: list[int]
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list | None = None
    prompt_logprobs: list | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


def collect(merged) -> dict[int, FinalOutput]:
    """Blocks until every request of `merged` finished; outputs by choice index."""
    finals: dict[int, FinalOutput] = {}
    while True:
        try:
            item = merged.get(None)
        except EOFError:
            return finals
        index, prompt_idx, res = item
        for out in res.outputs:
            final = finals.setdefault(index, FinalOutput(
                prompt_idx, list(res.prompt_token_ids),
                prompt_logprobs=getattr(res, "prompt_logprobs", None)))
            final.text += out.text
            final.token_ids.extend(out.token_ids)
            if getattr(out, "logprobs", None) is not None:
                final.logprobs = (final.logprobs or []) + list(out.logprobs)
            if out.finish_reason is not None:
                final.finish_reason, final.stop_reason = out.finish_reason, out.stop_reason


class StreamClock:
    """Set by ChunkStream.get; the chunk generators wait at most `remaining()`."""

    def __init__(self) -> None:
        self.deadline: float | None = None

    def start(self, timeout_s: float | None) -> None:
        self.deadline = None if timeout_s is None else time.monotonic() + timeout_s

    def remaining(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())


def include_usage(stream_options) -> tuple[bool, bool]:
    if not stream_options:
        return False, False
    usage = bool(stream_options.include_usage)
    return usage, usage and bool(stream_options.continuous_usage_stats)
