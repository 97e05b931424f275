"""Streaming deltas for tool_choice named / "required" (the JSON-schema constrained output).

Mirrors vllm/tool_parsers/streaming.py (vLLM 0.33): `extract_named_tool_call_streaming`
(first delta: id, type, name and the text so far; then raw argument text) and
`extract_required_tool_call_streaming`, which rescans the whole text each time with a
prefix-stable scanner of the array elements, so it needs no state beyond the two texts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from libvllm.engine.tool_parsers.protocol import (
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    make_tool_call_id,
)


def extract_named_tool_call_streaming(
    *, delta_text: str, function_name: str, function_name_returned: bool, index: int = 0
) -> tuple[DeltaMessage, bool]:
    if function_name_returned:
        call = DeltaToolCall(index=index, function=DeltaFunctionCall(arguments=delta_text))
    else:
        call = DeltaToolCall(
            id=make_tool_call_id(),
            type="function",
            index=index,
            function=DeltaFunctionCall(name=function_name, arguments=delta_text),
        )
    return DeltaMessage(tool_calls=[call]), True


@dataclass
class _Span:
    """One array element: its name once complete and the span of its arguments value."""

    name: str | None = None
    name_end: int | None = None
    args_start: int | None = None
    args_end: int | None = None
    closed: bool = False

    def ready_at(self, length: int) -> bool:
        return (
            self.name is not None
            and self.name_end is not None
            and self.name_end <= length
            and self.args_start is not None
            and self.args_start < length
        )

    @property
    def ready(self) -> bool:
        return self.name is not None and self.args_start is not None


_KEY, _COLON, _VALUE, _STRING, _CONTAINER, _SCALAR, _AFTER = range(7)


class CallScanner:
    """String- and nesting-aware single pass over a (partial) `[{...}, ...]` text (or one
    bare `{...}` with bare_object): per element the "name" value and the span of the
    `args_key` value. Spans are prefix-stable. `end` is set once the top level closes."""

    def __init__(self, text: str, args_key: str = "parameters", bare_object: bool = False):
        self.text, self.args_key, self.bare = text, args_key, bare_object
        self.elem_depth = 1 if bare_object else 2
        self.spans: list[_Span] = []
        self.end: int | None = None
        self.cur: _Span | None = None
        self.expect, self.key, self.value_start = _KEY, None, 0

    def end_value(self, pos: int) -> None:
        if self.key == self.args_key:
            self.cur.args_end = pos
        elif self.key == "name" and self.expect == _STRING:
            try:
                self.cur.name, self.cur.name_end = (
                    json.loads(self.text[self.value_start : pos]),
                    pos,
                )
            except ValueError:
                self.cur.name = None
        self.expect = _AFTER

    def start_value(self, pos: int, state: int) -> None:
        self.value_start = pos
        if self.key == self.args_key:
            self.cur.args_start = pos
        self.expect = state

    def _open(self, i: int, ch: str, depth: int) -> bool:
        """Handle `{` / `[`; False when the text is not a list of call objects."""
        starts_elem = depth == self.elem_depth - 1
        if depth == 0 and ch != ("{" if self.bare else "["):
            return False
        if starts_elem:
            if ch != "{":
                return False
            self.cur = _Span()
            self.spans.append(self.cur)
            self.expect, self.key = _KEY, None
        elif depth == self.elem_depth and self.cur is not None and self.expect == _VALUE:
            self.start_value(i, _CONTAINER)
        return True

    def scan(self) -> list[_Span]:
        depth, in_string, escaped, string_start = 0, False, False, 0
        for i, ch in enumerate(self.text):
            at_elem = depth == self.elem_depth and self.cur is not None
            if in_string:
                if escaped:
                    escaped = False
                elif ch == "\\":
                    escaped = True
                elif ch == '"':
                    in_string = False
                    if at_elem and self.expect == _KEY:
                        self.key, self.expect = self.text[string_start + 1 : i], _COLON
                    elif at_elem and self.expect == _STRING:
                        self.end_value(i + 1)
            elif ch == '"':
                in_string, string_start = True, i
                if at_elem and self.expect == _VALUE:
                    self.start_value(i, _STRING)
            elif ch in "{[":
                if not self._open(i, ch, depth):
                    return self.spans
                depth += 1
            elif ch in "}]":
                if at_elem and self.expect == _SCALAR:
                    self.end_value(i)
                depth -= 1
                if depth == self.elem_depth and self.cur is not None and self.expect == _CONTAINER:
                    self.end_value(i + 1)
                if depth == self.elem_depth - 1 and self.cur is not None:
                    self.cur.closed, self.cur = True, None
                if depth <= 0:
                    self.end = i + 1
                    return self.spans
            elif at_elem:
                self._punct(i, ch)
        return self.spans

    def _punct(self, i: int, ch: str) -> None:
        if ch == ":":
            if self.expect == _COLON:
                self.expect = _VALUE
        elif ch == ",":
            if self.expect == _SCALAR:
                self.end_value(i)
            self.expect, self.key = _KEY, None
        elif ch.isspace():
            if self.expect == _SCALAR:
                self.end_value(i)
        elif self.expect == _VALUE:
            self.start_value(i, _SCALAR)


def extract_required_tool_call_streaming(
    *, previous_text: str, current_text: str | None
) -> tuple[DeltaMessage | None, bool]:
    """Deltas for every array element with something unsent, in order; (delta, any call
    announced so far). `previous_text` must be a prefix of `current_text`."""
    if not current_text:
        return None, False
    spans = CallScanner(current_text).scan()
    sent_len = len(previous_text)
    calls: list[DeltaToolCall] = []
    for index, span in enumerate(spans):
        if not span.ready:
            break  # elements are generated in order
        end = span.args_end if span.args_end is not None else len(current_text)
        if span.ready_at(sent_len):
            new = current_text[min(end, sent_len) : end]
            if new:
                calls.append(DeltaToolCall(index=index, function=DeltaFunctionCall(arguments=new)))
            continue
        calls.append(
            DeltaToolCall(
                id=make_tool_call_id(),
                type="function",
                index=index,
                function=DeltaFunctionCall(
                    name=span.name, arguments=current_text[span.args_start : end]
                ),
            )
        )
    announced = any(span.ready for span in spans)
    return (DeltaMessage(tool_calls=calls) if calls else None), announced
