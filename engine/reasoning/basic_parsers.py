"""BaseThinkingReasoningParser: reasoning delimited by a start and an end token.

Mirrors vllm/reasoning/basic_parsers.py (vLLM 0.33). Both markers must be single tokens of
the vocab (upstream raises otherwise); streaming decides on token ids, so a marker split
across deltas as text is never mistaken for one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import islice
from typing import Any

from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.reasoning.abs_reasoning_parsers import ReasoningParser
from libvllm.engine.tool_parsers.protocol import DeltaMessage


class BaseThinkingReasoningParser(ReasoningParser):
    start_token: str = ""
    end_token: str = ""

    def __init__(self, tokenizer: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(tokenizer, *args, **kwargs)
        start_id, end_id = self.vocab.get(self.start_token), self.vocab.get(self.end_token)
        if start_id is None or end_id is None:
            raise InvalidArgumentError(
                f"{self.__class__.__name__} reasoning parser could not locate "
                "think start/end tokens in the tokenizer!"
            )
        self.start_token_id: int = start_id
        self.end_token_id: int = end_id

    def is_reasoning_end(self, input_ids: Sequence[int]) -> bool:
        for token_id in reversed(input_ids):
            if token_id == self.start_token_id:
                return False
            if token_id == self.end_token_id:
                return True
        return False

    def is_reasoning_end_streaming(
        self, input_ids: Sequence[int], delta_ids: Iterable[int]
    ) -> bool:
        return self.end_token_id in delta_ids

    def find_reasoning_end(self, delta_ids: Sequence[int]) -> tuple[int, bool] | None:
        for i, token_id in enumerate(delta_ids):
            if token_id == self.end_token_id:
                return i, False
        return None

    def count_reasoning_tokens(self, token_ids: Sequence[int]) -> int:
        """Tokens inside start/end markers (a depth count: nesting and stray ends are safe)."""
        count = depth = 0
        for token_id in token_ids:
            if token_id == self.start_token_id:
                depth += 1
            elif token_id == self.end_token_id:
                depth = max(0, depth - 1)
            elif depth:
                count += 1
        return count

    def extract_content_ids(self, input_ids: list[int]) -> list[int]:
        """The ids after the end token (none while it is the last or absent)."""
        if self.end_token_id not in islice(input_ids, 0, max(0, len(input_ids) - 1)):
            return []
        return input_ids[input_ids.index(self.end_token_id) + 1 :]

    def _split_delta(self, delta_text: str, start: bool) -> DeltaMessage:
        """A delta holding the end token (and the start token when `start`)."""
        begin = delta_text.find(self.start_token) + len(self.start_token) if start else 0
        end = delta_text.find(self.end_token)
        content = delta_text[end + len(self.end_token) :]
        return DeltaMessage(reasoning=delta_text[begin:end], content=content or None)

    def extract_reasoning_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
    ) -> DeltaMessage | None:
        if len(delta_token_ids) == 1 and delta_token_ids[0] in (
            self.start_token_id,
            self.end_token_id,
        ):
            return None  # a lone marker token
        if self.start_token_id in previous_token_ids:
            if self.end_token_id in delta_token_ids:
                return self._split_delta(delta_text, start=False)
            if self.end_token_id in previous_token_ids:
                return DeltaMessage(content=delta_text)
            return DeltaMessage(reasoning=delta_text)
        if self.start_token_id in delta_token_ids:
            if self.end_token_id in delta_token_ids:
                return self._split_delta(delta_text, start=True)
            return DeltaMessage(reasoning=delta_text)
        return DeltaMessage(content=delta_text)  # no start token seen

    def extract_reasoning(
        self, model_output: str, request: Any = None
    ) -> tuple[str | None, str | None]:
        before, marker, after = model_output.partition(self.start_token)
        model_output = after if marker else before
        if self.end_token not in model_output:
            return (
                model_output,
                None,
            )  # no end: everything is reasoning (start may be in the prompt)
        reasoning, _, content = model_output.partition(self.end_token)
        return reasoning, content or None
