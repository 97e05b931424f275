"""Mistral tool calls: pre-v11 `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]` and
v11+ `[TOOL_CALLS]name[ARGS]{...}` (or `name{...}`), v11 chosen when `[ARGS]` is a token.

Mirrors vllm/tool_parsers/mistral_tool_parser.py and the parts of vllm/parser/mistral.py that
do not need mistral-common (vLLM 0.33): `_legacy_extract_tool_calls`,
`_pre_v11_function_calls`, `_extract_args_json`, 9-character alphanumeric ids, and the
pre-v11 guided schema for tool_choice required / named (the parser parses that output
itself). Streaming rescans the accumulated text and diffs against what was sent: argument
text is streamed as the model writes it, so the fragments concatenate to the final
arguments.
"""

from __future__ import annotations

import json
import logging
import random
import string
from collections.abc import Sequence
from typing import Any

from libvllm.engine.structured_output.params import StructuredOutputsParams
from libvllm.engine.tool_parsers.abstract_tool_parser import ToolParser, request_field
from libvllm.engine.tool_parsers.protocol import (
    DeltaMessage,
    ExtractedToolCallInformation,
    FunctionCall,
    ToolCall,
)
from libvllm.engine.tool_parsers.streaming import CallScanner
from libvllm.engine.tool_parsers.tool_choice import named_tool_choice
from libvllm.engine.tool_parsers.utils import partial_tag_overlap, tool_name_and_parameters

logger = logging.getLogger(__name__)
BOT, ARGS = "[TOOL_CALLS]", "[ARGS]"


def generate_random_id() -> str:
    return "".join(random.choices(string.ascii_letters + string.digits, k=9))


def _pre_v11_function_calls(parsed: Any) -> list[FunctionCall]:
    """Calls of the JSON after a pre-v11 marker: a bare object is one call, non-call entries
    are skipped, a missing name is "", string arguments are kept as they are."""
    items = [parsed] if isinstance(parsed, dict) else parsed if isinstance(parsed, list) else []
    calls = []
    for item in items:
        if not isinstance(item, dict) or not ("name" in item or "arguments" in item):
            continue
        name, args = item.get("name"), item.get("arguments")
        if args is None:
            args = "{}"
        elif not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False)
        calls.append(FunctionCall(name=name if isinstance(name, str) else "", arguments=args))
    return calls


def _extract_args_json(raw_args: str) -> str:
    """The first complete JSON value of `raw_args` (trailing text dropped), else the text."""
    stripped = raw_args.strip()
    if not stripped:
        return "{}"
    try:
        _, end = json.JSONDecoder().raw_decode(stripped)
    except json.JSONDecodeError:
        return stripped
    return stripped[:end]


def _split_v11_call(segment: str) -> tuple[str | None, str | None]:
    """(name, raw args) of `name[ARGS]{...}` / `name{...}`; None parts not known yet."""
    if ARGS in segment:
        name, _, args = segment.partition(ARGS)
        return name.strip(), args
    if "{" in segment:
        cut = segment.index("{")
        return segment[:cut].strip(), segment[cut:]
    return None, None


class MistralToolParser(ToolParser):
    keep_special_tokens = True
    supports_required_and_named = False  # its own schema and parsing, see below

    def __init__(self, tokenizer: Any, tools: list | None = None) -> None:
        super().__init__(tokenizer, tools)
        self.is_pre_v11 = ARGS not in self.vocab
        self._sent_content = 0
        self._sent_trailing = 0

    def structured_outputs_for_tools(
        self, tool_choice: Any, parallel_tool_calls: bool | None = None
    ) -> StructuredOutputsParams | None:
        """required / named -> the pre-v11 bare array `[{"name", "arguments"}]` schema."""
        named = named_tool_choice(tool_choice)
        if not self.tools or (tool_choice != "required" and named is None):
            return None
        tools = [tool_name_and_parameters(t) for t in self.tools]
        tools = [(n, p) for n, p in tools if n is not None and (named is None or n == named)]
        if not tools:
            return None  # upstream logs and skips the guided schema
        any_of = [
            {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "enum": [name]},
                    "arguments": params or {"type": "object"},
                },
                "required": ["name", "arguments"],
            }
            for name, params in tools
        ]
        schema: dict[str, Any] = {
            "type": "array",
            "minItems": 1,
            "items": {"type": "object", "anyOf": any_of},
        }
        if named is not None:
            schema["maxItems"] = 1
        return StructuredOutputsParams(json=schema)

    def extract_tool_calls(
        self, model_output: str, request: Any = None
    ) -> ExtractedToolCallInformation:
        tool_choice, tools = request_field(request, "tool_choice"), request_field(request, "tools")
        no_calls = ExtractedToolCallInformation(
            tools_called=False, tool_calls=[], content=model_output
        )
        if tool_choice == "none" and tools:
            return no_calls
        forced = tool_choice == "required" or named_tool_choice(tool_choice) is not None
        if self.is_pre_v11 or (forced and BOT not in model_output):
            return self._legacy_extract(model_output, forced)
        if BOT not in model_output:
            return no_calls
        content, *segments = model_output.split(BOT)
        calls = []
        for segment in segments:
            name, args = _split_v11_call(segment)
            calls.append(
                FunctionCall(
                    name=segment.strip() if name is None else name,
                    arguments=_extract_args_json(args or ""),
                )
            )
        return ExtractedToolCallInformation(
            tools_called=True,
            tool_calls=[ToolCall(id=generate_random_id(), function=c) for c in calls],
            content=content if content.strip() else None,
        )

    def _legacy_extract(self, model_output: str, forced: bool) -> ExtractedToolCallInformation:
        content: str | None = None
        if BOT in model_output:
            content, *segments = model_output.split(BOT)
            calls_text = next((s.strip() for s in segments if s.strip()), "")
        elif forced:
            calls_text = model_output.strip()  # guided bare array, no marker
        else:
            return ExtractedToolCallInformation(
                tools_called=False, tool_calls=[], content=model_output
            )
        parsed = None
        try:
            parsed, _ = json.JSONDecoder().raw_decode(calls_text)
        except json.JSONDecodeError:
            start, end = calls_text.find("[{"), calls_text.rfind("}]")  # the upstream regex
            if 0 <= start < end:
                try:
                    parsed = json.loads(calls_text[start : end + 2])
                except json.JSONDecodeError:
                    parsed = None
        calls = _pre_v11_function_calls(parsed)
        if not calls:
            return ExtractedToolCallInformation(
                tools_called=False, tool_calls=[], content=calls_text
            )
        return ExtractedToolCallInformation(
            tools_called=True,
            tool_calls=[ToolCall(id=generate_random_id(), function=c) for c in calls],
            content=content if content and content.strip() else None,
        )

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
            return self._stream(current_text, request_field(request, "tool_choice"))
        except Exception:
            logger.debug("Error trying to handle streaming tool call.", exc_info=True)
            return None

    def _stream(self, current_text: str, tool_choice: Any) -> DeltaMessage | None:
        forced = tool_choice == "required" or named_tool_choice(tool_choice) is not None
        marker = current_text.find(BOT)
        if marker == -1 and forced and self.is_pre_v11:
            marker, body = 0, current_text  # guided bare array, no marker
        elif marker == -1:
            body = None
            marker = len(current_text) - partial_tag_overlap(current_text, BOT)
        else:
            body = current_text[marker + len(BOT) :]
        content = current_text[self._sent_content : marker] if marker > self._sent_content else ""
        self._sent_content = max(self._sent_content, marker)
        if body is None:
            calls, trailing = [], ""
        elif self.is_pre_v11:
            calls, trailing = self._pre_v11_progress(body.replace(BOT, ""))
        else:
            calls, trailing = self._v11_progress(body), ""
        deltas = self.stream_call_deltas(calls, generate_random_id)
        content += trailing
        if content or deltas:
            return DeltaMessage(content=content or None, tool_calls=deltas)
        return None

    def _pre_v11_progress(self, body: str) -> tuple[list[tuple[str, str]], str]:
        """Announceable (name, arguments so far) per call, and unsent trailing content."""
        text = body.lstrip()
        scanner = CallScanner(text, args_key="arguments", bare_object=text.startswith("{"))
        calls = []
        for span in scanner.scan():
            if span.name is None and not span.closed:
                break
            if span.args_start is None:
                args = "{}" if span.closed else ""
            elif text[span.args_start] == '"':
                if span.args_end is None:
                    break
                args = json.loads(text[span.args_start : span.args_end])
            else:
                args = text[span.args_start : span.args_end or len(text)]
            calls.append((span.name or "", args))
        trailing = ""
        if scanner.end is not None:
            offset = len(body) - len(text) + scanner.end
            trailing = self._unsent_trailing(body[offset:])
        return calls, trailing

    def _unsent_trailing(self, rest: str) -> str:
        sent, self._sent_trailing = self._sent_trailing, len(rest)
        return rest[sent:]

    def _v11_progress(self, body: str) -> list[tuple[str, str]]:
        calls = []
        for segment in body.split(BOT):
            name, raw = _split_v11_call(segment)
            if name is None:
                break
            raw = raw.lstrip()
            try:
                _, end = json.JSONDecoder().raw_decode(raw)
                raw = raw[:end]
            except json.JSONDecodeError:
                raw = raw[: len(raw) - partial_tag_overlap(raw, BOT)]
            calls.append((name, raw))
        return calls
