"""tool_choice "required" / named: the JSON schema that enforces it.

Mirrors `get_json_schema_from_tools` (+ `_get_json_schema_from_tools`, `_get_tool_schema_defs`,
`require_function_tools`) of vllm/tool_parsers/utils.py (vLLM 0.33): required -> a JSON array
of {"name", "parameters"} objects (minItems 1, maxItems 1 when parallel_tool_calls is false);
named -> the tool's parameters object is the whole output.
"""

from __future__ import annotations

import copy
from typing import Any

from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.tool_parsers.tool_choice import named_tool_choice
from libvllm.engine.tool_parsers.utils import tool_name_and_parameters


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
