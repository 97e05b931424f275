"""Qwen3 XML tool calls (`qwen3_xml` / `qwen3_coder`):

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Dallas
    </parameter>
    </function>
    </tool_call>

Mirrors vllm/tool_parsers/qwen3_engine_tool_parser.py over vllm/parser/qwen3.py (vLLM 0.33):
`<function=` also starts a call without `<tool_call>`, a parameter ends at `</parameter>` or
the next `<parameter=`, one wrapping newline is trimmed from each value, values are coerced
by the tool's JSON schema (vllm/parser/engine/parser_engine.py `_fix_arg_types`), and only
string-typed values stream before they close (`_safe_arg_prefix`), so every argument delta
extends a prefix of the final JSON. Whitespace-only content around calls is dropped.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import regex as re

from libvllm.engine.tool_parsers.abstract_tool_parser import ToolParser
from libvllm.engine.tool_parsers.protocol import (
    DeltaMessage,
    ExtractedToolCallInformation,
    FunctionCall,
    ToolCall,
)
from libvllm.engine.tool_parsers.utils import (
    coerce_to_schema_type,
    extract_types_from_schema,
    find_tool_properties,
    partial_tag_overlap,
)

logger = logging.getLogger(__name__)
TOOL_START, TOOL_END = "<tool_call>", "</tool_call>"
FUNC_PREFIX, FUNC_END = "<function=", "</function>"
PARAM_START, PARAM_END = "<parameter=", "</parameter>"
_PARAM_RE = re.compile(
    r"<\s*parameter\s*=\s*([^>]*)>(.*?)(?:<\s*/\s*parameter\s*>|(?=<\s*parameter\s*=))", re.DOTALL
)
_PARTIAL_PARAM_RE = re.compile(r"<\s*parameter\s*=\s*([^>]+)>(.*)$", re.DOTALL)
_NAME_END = re.compile(r"[>\n<]")


def _trim(value: str) -> str:
    """Drop one leading and one trailing newline (the template's markup)."""
    return value.removeprefix("\n").removesuffix("\n")


@dataclass
class _Call:
    name: str | None  # None: `<function=NAME>` not complete yet
    body: str = ""
    closed: bool = False


def _skip_tool_end(text: str, i: int) -> int:
    """Past optional whitespace + `</tool_call>` after a `</function>`."""
    j = i
    while j < len(text) and text[j].isspace():
        j += 1
    return j + len(TOOL_END) if text.startswith(TOOL_END, j) else i


def _parse(text: str) -> tuple[str, list[_Call], bool]:
    """(text outside calls, calls, whether the text ends outside a call)."""
    outside, calls, i = [], [], 0
    while i < len(text):
        found = [s for s in (text.find(TOOL_START, i), text.find(FUNC_PREFIX, i)) if s != -1]
        if not found:
            outside.append(text[i:])
            return "".join(outside), calls, True
        s = min(found)
        outside.append(text[i:s])
        if text.startswith(TOOL_START, s):
            j = s + len(TOOL_START)
            end, func = text.find(TOOL_END, j), text.find(FUNC_PREFIX, j)
            if func == -1 or (end != -1 and end < func):
                if end == -1:
                    return "".join(outside), calls, False
                i = end + len(TOOL_END)
                continue
            s = func
        j = s + len(FUNC_PREFIX)
        m = _NAME_END.search(text, j)
        if m is None:
            calls.append(_Call(None))
            return "".join(outside), calls, False
        if m.group() != ">":  # malformed name: the call is dropped
            end = text.find(FUNC_END, j)
            if end == -1:
                return "".join(outside), calls, False
            i = _skip_tool_end(text, end + len(FUNC_END))
            continue
        body_start = m.end()
        ends = [
            e
            for e in (text.find(FUNC_END, body_start), text.find(FUNC_PREFIX, body_start))
            if e != -1
        ]
        if not ends:
            calls.append(_Call(text[j : m.start()].strip(), text[body_start:]))
            return "".join(outside), calls, False
        e = min(ends)
        calls.append(_Call(text[j : m.start()].strip(), text[body_start:e], closed=True))
        i = _skip_tool_end(text, e + len(FUNC_END)) if text.startswith(FUNC_END, e) else e
    return "".join(outside), calls, True


def _valid_name(name: str | None) -> bool:
    return bool(name) and not any(ch.isspace() or ch in "<>" for ch in name)


class Qwen3XMLToolParser(ToolParser):
    keep_special_tokens = True
    structural_tag_model = "qwen_3_coder"

    def __init__(self, tokenizer: Any, tools: list | None = None) -> None:
        super().__init__(tokenizer, tools)
        self._sent_content = 0

    def _coerce(self, func: str, key: str, value: str) -> Any:
        prop = find_tool_properties(self.tools, func).get(key)
        if not isinstance(prop, dict):
            return value
        return coerce_to_schema_type(value, extract_types_from_schema(prop))

    def _arguments(self, call: _Call) -> str:
        """The call's arguments JSON, or (open call) the stable prefix of it."""
        done = {
            m.group(1).strip(): self._coerce(call.name, m.group(1).strip(), _trim(m.group(2)))
            for m in _PARAM_RE.finditer(call.body)
        }
        if call.closed:
            return json.dumps(done, ensure_ascii=False)
        prefix = json.dumps(done, ensure_ascii=False)[:-1]
        m = _PARTIAL_PARAM_RE.search(_PARAM_RE.sub("", call.body))
        if m is None or (key := m.group(1).strip()) in done or not self._streams(call.name, key):
            return prefix
        value = m.group(2)
        cut = value.rfind("<")
        if cut != -1 and any(
            t.startswith(value[cut:]) for t in (PARAM_END, PARAM_START, FUNC_END, FUNC_PREFIX)
        ):
            value = value[:cut]
        value = value.removeprefix("\n").removesuffix("\n")
        sep = ", " if done else ""
        return f'{prefix}{sep}{json.dumps(key)}: "{json.dumps(value, ensure_ascii=False)[1:-1]}'

    def _streams(self, func: str, key: str) -> bool:
        """Whether an open value can be sent before it closes (string-only, or no schema)."""
        props = find_tool_properties(self.tools, func)
        return not props or set(extract_types_from_schema(props.get(key))) == {"string"}

    def extract_tool_calls(
        self, model_output: str, request: Any = None
    ) -> ExtractedToolCallInformation:
        try:
            outside, calls, _ = _parse(model_output)
            tool_calls = [
                ToolCall(
                    function=FunctionCall(
                        name=c.name, arguments=self._arguments(_Call(c.name, c.body, closed=True))
                    )
                )
                for c in calls
                if _valid_name(c.name)
            ]
        except Exception:
            logger.debug("Error in extracting tool call from response.", exc_info=True)
            tool_calls, outside = [], model_output
        if not tool_calls:
            return ExtractedToolCallInformation(
                tools_called=False, tool_calls=[], content=model_output
            )
        content = outside.rstrip()
        return ExtractedToolCallInformation(
            tools_called=True, tool_calls=tool_calls, content=content or None
        )

    def _content_delta(self, outside: str, ends_outside: bool) -> str | None:
        if ends_outside:
            held = max(partial_tag_overlap(outside, t) for t in (TOOL_START, FUNC_PREFIX, TOOL_END))
            outside = outside[: len(outside) - held]
        outside = outside.rstrip()  # whitespace is sent only once text follows it
        if len(outside) <= self._sent_content:
            return None
        delta, self._sent_content = outside[self._sent_content :], len(outside)
        return delta

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
            outside, calls, ends_outside = _parse(current_text)
            content = self._content_delta(outside, ends_outside)
            valid = [(c.name, self._arguments(c)) for c in calls if _valid_name(c.name)]
            deltas = self.stream_call_deltas(valid)
            if content or deltas:
                return DeltaMessage(content=content, tool_calls=deltas)
            return None
        except Exception:
            logger.debug("Error trying to handle streaming tool call.", exc_info=True)
            return None
