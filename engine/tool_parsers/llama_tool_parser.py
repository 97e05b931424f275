"""Llama 3.x / 4 JSON tool calls: `{"name": ..., "parameters"|"arguments": {...}}`, several
separated by `; `, optionally after `<|python_tag|>`.

Mirrors vllm/tool_parsers/llama_tool_parser.py (`Llama3JsonToolParser`, vLLM 0.33):
non-streaming finds every top-level JSON object with `raw_decode`; streaming parses the
partial JSON each delta (partial_json_parser) and sends the name once complete, then the
stable prefix of the serialized arguments, flushing the rest when a call completes. Unlike
upstream, a delta that finishes several calls (large chunks) sends all of them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import partial_json_parser
import regex as re
from partial_json_parser.core.options import Allow

from libvllm.engine.errors import InvalidArgumentError
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
from libvllm.engine.tool_parsers.utils import (
    find_common_prefix,
    is_complete_json,
    partial_json_loads,
)

logger = logging.getLogger(__name__)
REGEX_TIMEOUT_S = 1  # VLLM_TOOL_PARSE_REGEX_TIMEOUT_SECONDS


def _args_delta(index: int, arguments: str) -> DeltaMessage:
    return DeltaMessage(
        tool_calls=[DeltaToolCall(index=index, function=DeltaFunctionCall(arguments=arguments))]
    )


class Llama3JsonToolParser(ToolParser):
    structural_tag_model = "llama"
    bot_token = "<|python_tag|>"
    tool_call_start_regex = re.compile(r"\{")
    json_decoder = json.JSONDecoder()

    def __init__(self, tokenizer: Any, tools: list | None = None) -> None:
        super().__init__(tokenizer, tools)
        self.bot_token_id = self.vocab.get(self.bot_token)
        if self.bot_token_id is None:
            raise InvalidArgumentError(
                "Llama3JsonToolParser could not locate the bot token "
                f"'{self.bot_token}' in the tokenizer."
            )

    def extract_tool_calls(
        self, model_output: str, request: Any = None
    ) -> ExtractedToolCallInformation:
        no_calls = ExtractedToolCallInformation(
            tools_called=False, tool_calls=[], content=model_output
        )
        if not (self.bot_token in model_output or "{" in model_output):
            return no_calls
        end_index = -1
        tool_calls: list[ToolCall] = []
        try:
            for match in self.tool_call_start_regex.finditer(model_output, timeout=REGEX_TIMEOUT_S):
                start = match.start()
                if start <= end_index:
                    continue  # a brace inside an object already parsed
                obj, length = self.json_decoder.raw_decode(model_output[start:])
                end_index = start + length
                args = obj["arguments"] if "arguments" in obj else obj["parameters"]
                tool_calls.append(
                    ToolCall(
                        function=FunctionCall(
                            name=obj["name"], arguments=json.dumps(args, ensure_ascii=False)
                        )
                    )
                )
        except TimeoutError:
            logger.warning("Regex timeout occurred when matching tool call pattern.")
            return no_calls
        except Exception:
            logger.debug("Error in extracting tool call from response.", exc_info=True)
            return no_calls
        if not tool_calls:
            return no_calls
        return ExtractedToolCallInformation(tools_called=True, tool_calls=tool_calls)

    def _parse_calls(self, text: str, flags: Allow) -> tuple[list[dict], list[bool]]:
        calls, complete = [], []
        start = len(self.bot_token) if text.startswith(self.bot_token) else 0
        while start < len(text):
            obj, end = partial_json_loads(text[start:], flags)
            complete.append(is_complete_json(text[start : start + end]))
            start += end + len("; ")
            if "parameters" in obj:
                if "arguments" in obj:
                    raise ValueError("model generated both parameters and arguments")
                obj["arguments"] = obj["parameters"]
            calls.append(obj)
        return calls, complete

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
        if not (current_text.startswith(self.bot_token) or current_text.startswith("{")):
            return DeltaMessage(content=delta_text)
        try:
            try:
                calls, complete = self._parse_calls(current_text, Allow.ALL)
                # An incomplete name string is never sent: OpenAI sends whole names.
                named, _ = self._parse_calls(current_text, Allow.ALL & ~Allow.STR)
            except partial_json_parser.core.exceptions.MalformedJSON:
                return None
            if not calls:
                return None
            deltas: list[DeltaToolCall] = []
            # Upstream moves one call per delta; a delta may finish several (big chunks).
            while len(calls) > self.current_tool_id + 1:
                if self.current_tool_id >= 0:
                    deltas += self._finish(calls[self.current_tool_id])
                self.current_tool_id += 1
                self.current_tool_name_sent = False
                self.streamed_args_for_tool.append("")
            index = self.current_tool_id
            if not self.current_tool_name_sent:
                name = named[index].get("name") if index < len(named) else None
                deltas += self._header(name)
            else:
                deltas += self._args_progress(calls[index], complete[index])
            self.prev_tool_call_arr = calls
            return DeltaMessage(tool_calls=deltas) if deltas else None
        except Exception:
            logger.debug("Error trying to handle streaming tool call.", exc_info=True)
            return None

    def _header(self, name: Any, arguments: str | None = None) -> list[DeltaToolCall]:
        if not isinstance(name, str) or not name:
            return []
        self.current_tool_name_sent = True
        function = DeltaFunctionCall(name=name, arguments=arguments)
        return [
            DeltaToolCall(
                index=self.current_tool_id,
                type="function",
                id=make_tool_call_id(),
                function=function,
            )
        ]

    def _send_args(self, diff: str) -> list[DeltaToolCall]:
        self.streamed_args_for_tool[self.current_tool_id] += diff
        return [
            DeltaToolCall(index=self.current_tool_id, function=DeltaFunctionCall(arguments=diff))
        ]

    def _finish(self, call: dict) -> list[DeltaToolCall]:
        """A later call started, so this one is complete: send what is left of it."""
        args = call.get("arguments")
        args_json = json.dumps(args, ensure_ascii=False) if args else ""
        if not self.current_tool_name_sent:
            self.streamed_args_for_tool[self.current_tool_id] = args_json
            return self._header(call.get("name"), args_json)
        sent = len(self.streamed_args_for_tool[self.current_tool_id])
        return self._send_args(args_json[sent:]) if args_json[sent:] else []

    def _args_progress(self, current: dict, is_complete: bool) -> list[DeltaToolCall]:
        if not (args := current.get("arguments")):
            return []
        sent = len(self.streamed_args_for_tool[self.current_tool_id])
        args_json = json.dumps(args, ensure_ascii=False)
        prev, index = self.prev_tool_call_arr, self.current_tool_id
        prev_args = prev[index].get("arguments") if index < len(prev) else None
        diff = None
        if is_complete:
            diff = args_json[sent:]
        elif prev_args:
            prev_json = json.dumps(prev_args, ensure_ascii=False)
            if args_json != prev_json:
                diff = find_common_prefix(prev_json, args_json)[sent:]
        return self._send_args(diff) if diff else []
