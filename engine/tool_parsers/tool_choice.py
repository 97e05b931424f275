"""tool_choice "required" / named: the JSON schema that enforces it and the parsing of the
constrained output.

Mirrors `get_json_schema_from_tools` (+ `_get_json_schema_from_tools`, `_get_tool_schema_defs`,
`require_function_tools`) of vllm/tool_parsers/utils.py and the required/named branches of
`DelegatingParser` in vllm/parser/abstract_parser.py (vLLM 0.33): required -> a JSON array of
{"name", "parameters"} objects (minItems 1, maxItems 1 when parallel_tool_calls is false);
named -> the tool's parameters object is the whole output.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from engine.errors import InvalidArgumentError
from engine.tool_parsers.protocol import FunctionCall, ToolCall
from engine.tool_parsers.utils import tool_name_and_parameters


def named_tool_choice(tool_choice: Any) -> str | None:
    """The function name of a named tool_choice (chat or Responses shape), else None."""
    if not isinstance(tool_choice, dict) or tool_choice.get("type", "function") != "function":
        return None
    fn = tool_choice.get("function", tool_choice)
    name = fn.get("name") if isinstance(fn, dict) else None
    return name if isinstance(name, str) else None


def _params_or_empty_object(params: dict | None) -> dict:
    return params if params else {"type": "object", "properties": {}}


def _function_tools(tools: list) -> list[tuple[str, dict | None]]:
    found = [tool_name_and_parameters(t) for t in tools]
    found = [(name, copy.deepcopy(params)) for name, params in found if name is not None]
    if not found:
        raise InvalidArgumentError(
            "tool_choice requires a function call, but tools contains no "
            "function tool the model can call."
        )
    return found


def _merged_defs(tools: list[tuple[str, dict | None]]) -> dict:
    all_defs: dict[str, Any] = {}
    for name, params in tools:
        defs = (params or {}).pop("$defs", {})
        if not isinstance(defs, dict):
            raise InvalidArgumentError(
                f"`$defs` in the parameters of tool '{name}' must be an "
                f"object, got {type(defs).__name__}."
            )
        for def_name, def_schema in defs.items():
            if def_name in all_defs and all_defs[def_name] != def_schema:
                raise InvalidArgumentError(
                    f"Tool definition '{def_name}' has multiple schemas, which is not supported."
                )
            all_defs[def_name] = def_schema
    return all_defs


def get_json_schema_from_tools(
    tool_choice: Any, tools: list | None, parallel_tool_calls: bool | None = None
) -> dict | None:
    if tool_choice in ("none", None) or tools is None:
        return None
    name = named_tool_choice(tool_choice)
    if name is not None:
        by_name = dict(_function_tools(tools))
        if name not in by_name:
            raise InvalidArgumentError(f"Tool '{name}' has not been passed in `tools`.")
        return _params_or_empty_object(by_name[name])
    if tool_choice != "required":
        return None
    fn_tools = _function_tools(tools)
    defs = _merged_defs(fn_tools)
    schema: dict[str, Any] = {
        "type": "array",
        "minItems": 1,
        "items": {
            "type": "object",
            "anyOf": [
                {
                    "properties": {
                        "name": {"type": "string", "enum": [name]},
                        "parameters": _params_or_empty_object(params),
                    },
                    "required": ["name", "parameters"],
                }
                for name, params in fn_tools
            ],
        },
    }
    if parallel_tool_calls is False:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema


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
