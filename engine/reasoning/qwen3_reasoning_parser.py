"""Qwen3 reasoning: `<think>...</think>` (the start usually in the prompt), `<tool_call>`
ending reasoning implicitly (it stays in the content), and
chat_template_kwargs={"enable_thinking": False} meaning no reasoning at all.

Mirrors vllm/reasoning/qwen3_engine_reasoning_parser.py over vllm/parser/qwen3.py
(`qwen3_config`: REASONING initial state, THINK_END and TOOL_START transitions, vLLM 0.33).
Streaming rescans the accumulated text and holds back a partial marker, so the reasoning and
content deltas concatenate to the non-streaming split.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from libvllm.engine.reasoning.basic_parsers import BaseThinkingReasoningParser
from libvllm.engine.tool_parsers.protocol import DeltaMessage
from libvllm.engine.tool_parsers.utils import partial_tag_overlap

TOOL_CALL_START = "<tool_call>"


class Qwen3ReasoningParser(BaseThinkingReasoningParser):
    start_token = "<think>"
    end_token = "</think>"

    def __init__(self, tokenizer: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(tokenizer, *args, **kwargs)
        chat_kwargs = kwargs.get("chat_template_kwargs") or {}
        self.thinking_enabled = chat_kwargs.get("enable_thinking", True) is not False
        self.tool_call_token_id = self.vocab.get(TOOL_CALL_START)
        tool_call = self.tool_call_token_id
        self.implicit_end_token_ids = () if tool_call is None else (tool_call,)
        self._sent_reasoning = self._sent_content = 0

    def _ends(self, token_id: int) -> bool:
        return token_id == self.end_token_id or token_id == self.tool_call_token_id

    def is_reasoning_end(self, input_ids: Sequence[int]) -> bool:
        for token_id in reversed(input_ids):
            if token_id == self.start_token_id:
                return False
            if self._ends(token_id):
                return True
        return False

    def is_reasoning_end_streaming(
        self, input_ids: Sequence[int], delta_ids: Iterable[int]
    ) -> bool:
        return any(self._ends(t) for t in delta_ids)

    def find_reasoning_end(self, delta_ids: Sequence[int]) -> tuple[int, bool] | None:
        for i, token_id in enumerate(delta_ids):
            if self._ends(token_id):
                return i, token_id != self.end_token_id
        return None

    def extract_content_ids(self, input_ids: list[int]) -> list[int]:
        for i, token_id in enumerate(input_ids[:-1]):
            if self._ends(token_id):
                return input_ids[i + (token_id == self.end_token_id) :]
        return []

    def _split(self, text: str, final: bool) -> tuple[str, str]:
        """(reasoning, content) of `text`; unless final, a partial marker is held back."""
        before, marker, after = text.partition(self.start_token)
        text = before + after if marker else before
        ends = [(text.find(m), m) for m in (self.end_token, TOOL_CALL_START) if m in text]
        if ends:
            cut, found = min(ends)
            skip = len(found) if found == self.end_token else 0
            return text[:cut], text[cut + skip :]
        if not final:
            markers = (self.end_token, TOOL_CALL_START, self.start_token)
            text = text[: len(text) - max(partial_tag_overlap(text, m) for m in markers)]
        return text, ""

    def extract_reasoning(
        self, model_output: str, request: Any = None
    ) -> tuple[str | None, str | None]:
        if not self.thinking_enabled:
            return None, model_output
        reasoning, content = self._split(model_output, final=True)
        return reasoning, content or None

    def extract_reasoning_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
    ) -> DeltaMessage | None:
        if not self.thinking_enabled:
            return DeltaMessage(content=delta_text) if delta_text else None
        reasoning, content = self._split(current_text, final=False)
        new_reasoning = reasoning[self._sent_reasoning :]
        new_content = content[self._sent_content :]
        self._sent_reasoning = max(self._sent_reasoning, len(reasoning))
        self._sent_content = max(self._sent_content, len(content))
        if not new_reasoning and not new_content:
            return None
        return DeltaMessage(reasoning=new_reasoning or None, content=new_content or None)
