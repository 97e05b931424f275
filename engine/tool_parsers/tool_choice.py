"""tool_choice "required" / named: the function a named choice names, and the parsing of
the output that the tool_choice schema (engine/tool_parsers/tool_choice_schema.py)
constrained.

Mirrors the required/named branches of `DelegatingParser` in vllm/parser/abstract_parser.py
(vLLM 0.33): required -> a JSON array of {"name", "parameters"} objects; named -> the
tool's parameters object is the whole output.
"""

from __future__ import annotations

import json
from typing import Any

from libvllm.engine.tool_parsers.protocol import FunctionCall, ToolCall


def named_tool_choice(tool_choice: Any) -> str | None:
    """The function name of a named tool_choice (chat or Responses shape), else None."""
    if not isinstance(tool_choice, dict) or tool_choice.get("type", "function") != "function":
        return None
    fn = tool_choice.get("function", tool_choice)
    name = fn.get("name") if isinstance(fn, dict) else None
    return name if isinstance(name, str) else None


def extract_forced_tool_calls(content: str | None, tool_choice: Any) -> list[ToolCall]:
    """Tool calls of an output constrained by the required / named schema (non-streaming).

    Named: the whole output is the arguments. Required: a JSON array of {"name",
    "parameters"}; output that does not parse gives no calls (as upstream).
    """
    name = named_tool_choice(tool_choice)
    if name is not None:
        if content is None or not content.strip():
            return []
        return [ToolCall(function=FunctionCall(name=name, arguments=content))]
    try:
        parsed = json.loads(content or "")
    except ValueError:
        return []
    if not isinstance(parsed, list):
        return []
    calls = []
    for item in parsed:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return []
        if not isinstance(item.get("parameters"), (dict, type(None))):
            return []
        args = json.dumps(item.get("parameters"), ensure_ascii=False)
        calls.append(ToolCall(function=FunctionCall(name=item["name"], arguments=args)))
    return calls
