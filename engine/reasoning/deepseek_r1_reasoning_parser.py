"""DeepSeek-R1 reasoning: `<think>...</think>`, the start token usually in the prompt.

Mirrors vllm/reasoning/deepseek_r1_reasoning_parser.py (vLLM 0.33): like the base parser,
but streaming without a start token treats text as reasoning until `</think>`.
"""

from __future__ import annotations

from collections.abc import Sequence

from libvllm.engine.reasoning.basic_parsers import BaseThinkingReasoningParser
from libvllm.engine.tool_parsers.protocol import DeltaMessage


class DeepSeekR1ReasoningParser(BaseThinkingReasoningParser):
    start_token = "<think>"
    end_token = "</think>"

    def extract_reasoning_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
    ) -> DeltaMessage | None:
        ret = super().extract_reasoning_streaming(
            previous_text,
            current_text,
            delta_text,
            previous_token_ids,
            current_token_ids,
            delta_token_ids,
        )
        if ret is None or self.start_token_id in previous_token_ids:
            return ret
        if self.start_token_id in delta_token_ids:
            return ret
        if self.end_token_id in delta_token_ids:
            return self._split_delta(delta_text, start=False)
        if self.end_token_id in previous_token_ids:
            return DeltaMessage(content=delta_text)
        return DeltaMessage(reasoning=delta_text)
