"""Helpers shared by tool parsers: partial tags and JSON, tool lookups, schema coercion.

Mirrors vllm/tool_parsers/utils.py (vLLM 0.33): `partial_tag_overlap`,
`find_common_prefix`, `partial_json_loads`, `is_complete_json`, `find_tool_properties`,
`extract_types_from_schema`, `coerce_to_schema_type`. Tools are the OpenAI request dicts
({"type": "function", "function": {"name", "parameters"}}; the Responses shape with
top-level "name"/"parameters" is accepted too).
"""

from __future__ import annotations

import json
import math
from json import JSONDecodeError, JSONDecoder
from typing import Any

import partial_json_parser
from partial_json_parser.core.options import Allow


def partial_tag_overlap(text: str, tag: str) -> int:
    """Length of the longest proper prefix of `tag` that ends `text`."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


def find_common_prefix(s1: str, s2: str) -> str:
    n = 0
    for a, b in zip(s1, s2):
        if a != b:
            break
        n += 1
    return s1[:n]


def partial_json_loads(input_str: str, flags: Allow) -> tuple[Any, int]:
    """Parse a possibly incomplete JSON value; (value, characters consumed)."""
    try:
        return partial_json_parser.loads(input_str, flags), len(input_str)
    except JSONDecodeError as e:
        if "Extra data" in e.msg:
            return JSONDecoder().raw_decode(input_str)
        raise


def is_complete_json(input_str: str) -> bool:
    try:
        json.loads(input_str)
        return True
    except JSONDecodeError:
        return False


def tool_name_and_parameters(tool: Any) -> tuple[str | None, dict | None]:
    """(name, parameters schema) of a function tool dict, or (None, None)."""
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        return None, None
    fn = tool.get("function", tool)
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        return None, None
    params = fn.get("parameters")
    return fn["name"], params if isinstance(params, dict) else None


def find_tool_properties(tools: list | None, tool_name: str) -> dict[str, Any]:
    """The `properties` of the named tool's parameters schema, or {}."""
    for tool in tools or []:
        name, params = tool_name_and_parameters(tool)
        if name == tool_name:
            props = (params or {}).get("properties", {})
            return props if isinstance(props, dict) else {}
    return {}


def extract_types_from_schema(schema: Any) -> list[str]:
    """Every JSON type a schema allows (type, enum values, anyOf/oneOf/allOf); ["string"]."""
    if not isinstance(schema, dict):
        return ["string"]
    types: set[str] = set()
    t = schema.get("type")
    if isinstance(t, str):
        types.add(t)
    elif isinstance(t, list):
        types.update(x for x in t if isinstance(x, str))
    enum = schema.get("enum")
    if isinstance(enum, list):
        for v in enum:
            types.add(
                "null"
                if v is None
                else "boolean"
                if isinstance(v, bool)
                else "integer"
                if isinstance(v, int)
                else "number"
                if isinstance(v, float)
                else "string"
                if isinstance(v, str)
                else "array"
                if isinstance(v, list)
                else "object"
            )
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list):
            for choice in schema[key]:
                types.update(extract_types_from_schema(choice))
    return list(types) if types else ["string"]


_TYPE_ALIASES = {
    **dict.fromkeys(("str", "text", "varchar", "char", "enum"), "string"),
    **dict.fromkeys(
        ("int", "int32", "int64", "uint", "uint32", "uint64", "long", "short", "unsigned"),
        "integer",
    ),
    **dict.fromkeys(("float", "float32", "float64", "double"), "number"),
    "bool": "boolean",
    "dict": "object",
    **dict.fromkeys(("arr", "list", "sequence"), "array"),
}
_PRIORITY = ("null", "integer", "number", "boolean", "object", "array", "string")


def _finite(obj: Any) -> bool:
    try:
        json.dumps(obj, allow_nan=False)
        return True
    except (ValueError, TypeError):
        return False


def _coerce_one(value: str, kind: str) -> tuple[bool, Any]:
    if kind == "null":
        return value.lower() == "null", None
    if kind == "string":
        return True, value
    if kind in ("integer", "number"):
        try:
            return True, int(value)
        except ValueError:
            pass
        if kind == "integer":
            return False, None
        try:
            f = float(value)
        except ValueError:
            return False, None
        return math.isfinite(f), (f if f != int(f) else int(f)) if math.isfinite(f) else None
    if kind == "boolean":
        low = value.lower().strip()
        return low in ("true", "1", "false", "0"), low in ("true", "1")
    try:
        parsed = json.loads(value)
    except ValueError:
        return False, None
    return _finite(parsed), parsed


def coerce_to_schema_type(value: str, schema_type: str | list[str]) -> Any:
    """Best-effort conversion of a raw string to the schema's type (priority null > integer >
    number > boolean > object > array > string); else JSON if it parses finitely, else text."""
    kinds = [schema_type] if isinstance(schema_type, str) else schema_type
    normalized = {_TYPE_ALIASES.get(k.strip().lower(), k.strip().lower()) for k in kinds}
    for kind in _PRIORITY:
        if kind in normalized:
            ok, converted = _coerce_one(value, kind)
            if ok:
                return converted
    try:
        parsed = json.loads(value)
    except ValueError:
        return value
    return parsed if _finite(parsed) else value
