"""Hermes / Qwen JSON tool calls: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

Mirrors vllm/tool_parsers/hermes_tool_parser.py (`Hermes2ProToolParser`, vLLM 0.33):
non-streaming by regex (an unterminated last call at EOS counts), streaming by re-parsing the
accumulated text each delta and diffing against what was sent: content up to the first
`<tool_call>` (holding back a partial tag), then per call its name once and the raw
arguments text as it grows.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import regex as re

from libvllm.engine.tool_parsers.abstract_tool_parser import ToolParser
from libvllm.engine.tool_parsers.protocol import (
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    ExtractedToolCallInformation,
    FunctionCall,
    ToolCall,
    make_tool_call_id,
)
from libvllm.engine.tool_parsers.utils import is_complete_json, partial_tag_overlap

logger = logging.getLogger(__name__)


class Hermes2ProToolParser(ToolParser):
    keep_special_tokens = True
    structural_tag_model = "hermes"
    tool_call_start_token = "<tool_call>"
    tool_call_end_token = "</tool_call>"
    tool_call_regex = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)

    def __init__(self, tokenizer: Any, tools: list | None = None) -> None:
        super().__init__(tokenizer, tools)
        self._sent_content_idx = 0

    def extract_tool_calls(
        self, model_output: str, request: Any = None
    ) -> ExtractedToolCallInformation:
        if self.tool_call_start_token not in model_output:
            return ExtractedToolCallInformation(
                tools_called=False, tool_calls=[], content=model_output
            )
        try:
            raw_calls = [
                json.loads(m[0] if m[0] else m[1])
                for m in self.tool_call_regex.findall(model_output)
            ]
            tool_calls = [
                ToolCall(
                    function=FunctionCall(
                        name=call["name"],
                        arguments=json.dumps(call["arguments"], ensure_ascii=False),
                    )
                )
                for call in raw_calls
            ]
        except Exception:
            logger.debug("Error in extracting tool call from response.", exc_info=True)
            return ExtractedToolCallInformation(
                tools_called=False, tool_calls=[], content=model_output
            )
        content = model_output[: model_output.find(self.tool_call_start_token)]
        return ExtractedToolCallInformation(
            tools_called=True, tool_calls=tool_calls, content=content or None
        )

    def _extract_content(self, current_text: str) -> str | None:
        """Unsent text before any tool call, holding back a possible partial tag."""
        if self.tool_call_start_token in current_text:
            sendable = current_text.index(self.tool_call_start_token)
        else:
            sendable = len(current_text) - partial_tag_overlap(
                current_text, self.tool_call_start_token
            )
        if sendable > self._sent_content_idx:
            content = current_text[self._sent_content_idx : sendable]
            self._sent_content_idx = sendable
            return content
        return None

    def _extract_tool_call_jsons(self, text: str) -> list[tuple[str, bool]]:
        """(json_text, is_complete) of each <tool_call> region."""
        results: list[tuple[str, bool]] = []
        pos = 0
        while (start := text.find(self.tool_call_start_token, pos)) != -1:
            json_start = start + len(self.tool_call_start_token)
            json_end = text.find(self.tool_call_end_token, json_start)
            if json_end != -1:
                results.append((text[json_start:json_end].strip(), True))
                pos = json_end + len(self.tool_call_end_token)
                continue
            raw = text[json_start:]
            overlap = partial_tag_overlap(raw, self.tool_call_end_token)
            tc_json = (raw[:-overlap] if overlap else raw).strip()
            results.append((tc_json, is_complete_json(tc_json) if tc_json else False))
            break
        return results

    @staticmethod
    def _extract_tool_name(tc_json: str) -> str | None:
        match = re.search(r'"name"\s*:\s*"([^"]+)"', tc_json)
        return match.group(1) if match else None

    @staticmethod
    def _extract_tool_args(tc_json: str, is_complete: bool) -> str | None:
        """The text after `"arguments":`, minus the outer object's `}` once complete."""
        match = re.search(r'"arguments"\s*:\s*', tc_json)
        if not match:
            return None
        raw = tc_json[match.end() :]
        if is_complete:
            raw = raw.rstrip()
            if raw.endswith("}"):
                raw = raw[:-1].rstrip()
        return raw

    def _compute_args_diff(self, index: int, tc_json: str, is_complete: bool) -> str | None:
        args = self._extract_tool_args(tc_json, is_complete)
        if args is None or len(args) <= len(self.streamed_args_for_tool[index]):
            return None
        diff = args[len(self.streamed_args_for_tool[index]) :]
        self.streamed_args_for_tool[index] = args
        self.prev_tool_call_arr[index]["arguments"] = args
        return diff

    def extract_tool_calls_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
        request: Any = None,
    ) -> DeltaMessage | None:
        try:
            content = self._extract_content(current_text)
            deltas: list[DeltaToolCall] = []
            for i, (tc_json, is_complete) in enumerate(self._extract_tool_call_jsons(current_text)):
                if i >= len(self.prev_tool_call_arr):
                    self.prev_tool_call_arr.append({})
                    self.streamed_args_for_tool.append("")
                if "name" not in self.prev_tool_call_arr[i]:
                    name = self._extract_tool_name(tc_json)
                    if not name:
                        break  # tool i+1 cannot start before tool i is named
                    self.prev_tool_call_arr[i]["name"] = name
                    deltas.append(
                        DeltaToolCall(
                            index=i,
                            type="function",
                            id=make_tool_call_id(),
                            function=DeltaFunctionCall(name=name),
                        )
                    )
                if diff := self._compute_args_diff(i, tc_json, is_complete):
                    deltas.append(
                        DeltaToolCall(index=i, function=DeltaFunctionCall(arguments=diff))
                    )
            if content or deltas:
                return DeltaMessage(content=content, tool_calls=deltas)
            return None
        except Exception:
            logger.debug("Error trying to handle streaming tool call.", exc_info=True)
            return None
