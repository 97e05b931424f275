"""Strict tool calling: the structural tag that constrains a tool call's envelope and, for
tools marked `strict`, its arguments, while text outside calls stays free.

Mirrors vLLM 0.33: vllm/tool_parsers/tool_strict_level.py (ToolStrictLevel),
vllm/tool_parsers/structural_tag_registry.py (get_function_parameters, the hermes builder
_hermes_style_structural_tag, resolve_tool_strictness, get_model_structural_tag over
xgrammar's builtin templates, limit_to_single_tool_call) and
vllm/parser/abstract_parser.py DelegatingParser._apply_structural_tag (a request's own
structured output ORed with the calls of tool_choice auto, parallel_tool_calls=false
stopping after one call).
VLLM_ENFORCE_STRICT_TOOL_CALLING=0 turns it off, as upstream; `--tool-strict-level`
(EngineConfig.tool_strict_level) raises the floor. A parser with a `structural_tag_model`
takes every tool_choice this way (required / named included, parsed by the parser as in
vLLM, where `supports_required_and_named` turns off); the others keep the JSON-schema
grammar of required / named (engine/tool_parsers/tool_choice_schema.py), vLLM's path for
them and for every parser with VLLM_ENFORCE_STRICT_TOOL_CALLING=0.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import logging
from typing import Any

from pydantic import TypeAdapter

from libvllm.engine import envs
from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.structured_output.json_nesting import check_json_nesting
from libvllm.engine.structured_output.params import StructuredOutputsParams

logger = logging.getLogger(__name__)
_LAX_BOOL = TypeAdapter(bool)

# xgrammar's builtin templates our parsers name (xgrammar.builtin_structural_tag)
XGRAMMAR_MODELS = frozenset({"llama", "qwen_3_coder"})


class ToolStrictLevel(enum.IntEnum):
    """AUTO: the envelope only when a tool is `strict` (or a call is forced), arguments of
    strict tools pinned; FUNCTION: the envelope for every request with tools; PARAMETER:
    every tool's arguments pinned too, as if each were strict."""

    AUTO = 0
    FUNCTION = 1
    PARAMETER = 2

    @classmethod
    def from_name(cls, name: str) -> ToolStrictLevel:
        """--tool-strict-level's value, any case; vLLM's message for another."""
        try:
            return cls[name.strip().upper()]
        except (KeyError, AttributeError):
            expected = ", ".join(level.name.lower() for level in cls)
            raise InvalidArgumentError(
                f"Unknown tool strict level {name!r}; expected one of {expected}.") from None


def strict_tool_calling_enforced() -> bool:
    """vllm/envs.py: on unless the variable is something other than true / 1."""
    return envs.VLLM_ENFORCE_STRICT_TOOL_CALLING


def _function(tool: Any) -> dict | None:
    """A chat tool's function dict ({"type": "function", "function": {...}}), else None;
    its `strict` as the request's validation reads it (pydantic's lax bool: "true", 1)."""
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        return None
    fn = tool.get("function")
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        return None
    if fn.get("strict") is not None:
        fn = {**fn, "strict": _LAX_BOOL.validate_python(fn["strict"])}
    return fn


def get_function_parameters(function: dict) -> dict | bool:
    """The JSON schema a call's arguments must match: True (any JSON) for strict=False."""
    if function.get("strict") is False:
        return True
    params = function.get("parameters")
    return params if params is not None else True


def resolve_tool_strictness(tools: list[dict], tool_choice: Any,
                            strict_level: ToolStrictLevel) -> list[dict] | None:
    """The function tools with `strict` pinned, or None: no structural tag (auto, level
    AUTO, no strict tool)."""
    functions = [fn for fn in map(_function, tools) if fn is not None]
    if not functions:
        return None
    if tool_choice == "auto" and strict_level == ToolStrictLevel.AUTO \
            and not any(fn.get("strict") is True for fn in functions):
        return None
    return [{"type": "function", "function": {
        **fn, "strict": strict_level >= ToolStrictLevel.PARAMETER or fn.get("strict") is True}}
        for fn in functions]


def hermes_structural_tag(tools: list[dict], tool_choice: str) -> Any:
    """<tool_call> {"name": ..., "arguments": ...} </tool_call>, with or without the
    newlines; auto: free text until "<tool_call>"; required: one or more calls; forced
    (a named choice, `tools` that one): one call."""
    from xgrammar.structural_tag import (
        AnyTextFormat,
        JSONSchemaFormat,
        StructuralTag,
        TagFormat,
        TagsWithSeparatorFormat,
        TriggeredTagsFormat,
    )

    start, end = "<tool_call>", "</tool_call>"
    tags = [TagFormat(begin=begin + json.dumps(tool["function"]["name"])[1:-1]
                      + '", "arguments": ',
                      content=JSONSchemaFormat(
                          json_schema=get_function_parameters(tool["function"])),
                      end=close)
            for tool in tools
            for begin, close in ((start + '\n{"name": "', "}\n" + end),
                                 (start + '{"name": "', "}" + end))]
    if tool_choice == "auto":
        fmt = TriggeredTagsFormat(triggers=[start], tags=tags) if tags else AnyTextFormat()
    else:
        fmt = TagsWithSeparatorFormat(tags=tags, separator="", at_least_one=True,
                                      stop_after_first=tool_choice == "forced")
    return StructuralTag(format=fmt)


def get_model_structural_tag(model: str, tools: list[dict], tool_choice: Any) -> Any:
    """The structural tag of `model`'s tool-call syntax over already resolved tools;
    tool_choice "auto", "required" or a named choice ({"type": "function", "function":
    {"name": ...}})."""
    if model == "hermes":
        if isinstance(tool_choice, dict):  # xgrammar's normalize_tool_choice: that tool
            name = tool_choice["function"]["name"]
            return hermes_structural_tag(
                [t for t in tools if t["function"]["name"] == name], "forced")
        return hermes_structural_tag(tools, tool_choice)
    if model not in XGRAMMAR_MODELS:
        raise ValueError(f"Unknown format type: {model}, supported types: "
                         f"{sorted(XGRAMMAR_MODELS | {'hermes'})}")
    import xgrammar

    return xgrammar.get_model_structural_tag(model=model, tools=tools,
                                             tool_choice=tool_choice, reasoning=False)


def limit_to_single_tool_call(tag: Any) -> Any:
    """Stop every tool-call list in `tag` after its first call, in place
    (parallel_tool_calls=false)."""
    from pydantic import BaseModel
    from xgrammar.structural_tag import (
        TagsWithSeparatorFormat,
        TokenTriggeredTagsFormat,
        TriggeredTagsFormat,
    )

    def visit(node: Any) -> None:
        if isinstance(node, BaseModel):
            if isinstance(node, (TriggeredTagsFormat, TokenTriggeredTagsFormat,
                                 TagsWithSeparatorFormat)):
                node.stop_after_first = True
            for name in type(node).model_fields:
                visit(getattr(node, name))
        elif isinstance(node, (list, tuple)):
            for item in node:
                visit(item)

    visit(tag.format)
    return tag


def structured_outputs_to_format(params: StructuredOutputsParams) -> Any:
    """A request's own constraint as an xgrammar Format (vLLM's structured_outputs_to_format);
    None for what this cannot express (a structural tag's legacy form)."""
    from xgrammar import Grammar
    from xgrammar.structural_tag import (
        ConstStringFormat,
        GrammarFormat,
        JSONSchemaFormat,
        OrFormat,
        RegexFormat,
        StructuralTag,
    )

    from libvllm.engine.structured_output.utils import grammar_is_likely_lark

    if params.json_object:
        return JSONSchemaFormat(json_schema={"type": "object"})
    if params.json is not None:
        schema = params.json
        return JSONSchemaFormat(json_schema=json.loads(schema) if isinstance(schema, str)
                                else schema)
    if params.regex is not None:
        return RegexFormat(pattern=params.regex)
    if params.choice is not None:
        return OrFormat(elements=[ConstStringFormat(value=c) for c in params.choice])
    if params.grammar is not None:
        grammar = params.grammar
        if grammar_is_likely_lark(grammar):
            grammar = str(Grammar.from_lark(grammar))
        return GrammarFormat(grammar=grammar)
    tag = json.loads(params.structural_tag)
    return None if "structures" in tag else StructuralTag.model_validate(tag).format


def tool_structural_tag(model: str | None, tools: list | None, tool_choice: Any,
                        parallel_tool_calls: bool | None,
                        own: StructuredOutputsParams | None,
                        strict_level: ToolStrictLevel | None = None
                        ) -> StructuredOutputsParams | None:
    """_apply_structural_tag: the constraint of a request whose parser names a
    structural-tag model, calls in the model's syntax (arguments pinned for strict tools).
    auto: text, or the request's own constraint `own`, beside them; None where no tag
    applies (the request keeps `own`). required / named (a dict naming a function, checked
    against the tools by the request's validation): calls only, `own` ignored.
    strict_level: --tool-strict-level, None for the parsers' default (AUTO)."""
    if model is None or not tools or not strict_tool_calling_enforced() \
            or tool_choice in (None, "none"):
        return None
    level = ToolStrictLevel.AUTO if strict_level is None else strict_level
    is_auto = tool_choice == "auto"
    single = parallel_tool_calls is False
    if single and not (is_auto and own is not None):  # counting needs the call envelope
        level = max(level, ToolStrictLevel.FUNCTION)
    resolved = resolve_tool_strictness(tools, tool_choice, level)
    if resolved is None:
        return None
    from xgrammar.structural_tag import OrFormat, StructuralTag

    for tool in resolved:  # the schemas the grammar pins (others: any JSON)
        schema = get_function_parameters(tool["function"])
        if isinstance(schema, dict):
            check_json_nesting(schema)
    output = None
    if is_auto and own is not None:
        output = _own_format(own)
        if output is None:
            return None
    if not is_auto and own is not None:
        _warning_once("structured outputs are ignored because tool_choice forces tool call.")
    # auto with a constraint of its own: a call or that constraint, never free text
    tag = get_model_structural_tag(model, resolved,
                                   "required" if output is not None else tool_choice)
    if single:
        limit_to_single_tool_call(tag)
    if output is not None:
        tag = StructuralTag(format=OrFormat(elements=[tag.format, output]))
    return StructuredOutputsParams(structural_tag=tag.model_dump_json())


def _own_format(own: StructuredOutputsParams) -> Any:
    """`own` as a Format when xgrammar takes it alone (vLLM's _xgrammar_supports), else None
    with a warning: the request's constraint then applies without the tool calls'."""
    from xgrammar import Grammar
    from xgrammar.structural_tag import StructuralTag

    from libvllm.engine.structured_output.backend_xgrammar import validate_xgrammar_grammar

    check_json_nesting(own.json)
    check_json_nesting(own.structural_tag, structural_tag=True)
    try:  # what xgrammar would ignore (uniqueItems, ...) or refuse: the request alone
        validate_xgrammar_grammar(dataclasses.replace(own))  # rewrites a choice in place
        output = structured_outputs_to_format(own)
        if output is None:
            raise ValueError("a structural tag in its legacy form")
        Grammar.from_structural_tag(StructuralTag(format=output).model_dump_json())
    except Exception:  # noqa: BLE001 - xgrammar refuses with several error types
        _warning_once("Tool calls are not constrained for tool_choice=auto with structured "
                      "outputs because xgrammar does not support the structured output "
                      "constraint; the structured output constraint applies.")
        return None
    return output


@functools.cache
def _warning_once(message: str) -> None:
    logger.warning(message)
