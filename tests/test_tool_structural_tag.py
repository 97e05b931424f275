"""Strict tool calling (engine/tool_parsers/structural_tag.py): the structural tag of a
tool_choice "auto" request with strict tools, checked by compiling it with xgrammar and
asking which outputs it accepts, and its way through /v1/chat/completions.

Ports cases of vLLM 0.33 tests/tool_parsers/test_structural_tag_registry.py
(test_get_model_structural_tag_supports_vllm_hermes, test_hermes_required_without_strict_
leaves_arguments_free, test_auto_tool_choice_skips_structural_tag_without_strict,
test_get_function_parameters_relaxes_function_strict_false) and the tool_choice "auto"
rules of vllm/parser/abstract_parser.py _apply_structural_tag (parallel_tool_calls=false,
the request's own structured output ORed with the calls). Oracle: xgrammar's own matcher
(_is_grammar_accept_string) over hand-written outputs in each parser's syntax.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace

import pytest
from xgrammar import Grammar
from xgrammar.testing import _is_grammar_accept_string

from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.structured_output.params import StructuredOutputsParams
from libvllm.engine.tool_parsers.structural_tag import (
    ToolStrictLevel,
    get_function_parameters,
    get_model_structural_tag,
    resolve_tool_strictness,
    tool_structural_tag,
)
from tests.test_openai_parsers import ScriptedClient, chat, tokenizer  # noqa: F401

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
          "additionalProperties": False}


def _tools(strict: bool | None) -> list[dict]:
    fn = {"name": "get_weather", "parameters": SCHEMA}
    if strict is not None:
        fn["strict"] = strict
    return [{"type": "function", "function": fn}]


def _hermes(args: str, newline: bool = True) -> str:
    nl = "\n" if newline else ""
    return f'<tool_call>{nl}{{"name": "get_weather", "arguments": {args}}}{nl}</tool_call>'


def _accepts(params: StructuredOutputsParams, text: str) -> bool:
    return _is_grammar_accept_string(Grammar.from_structural_tag(params.structural_tag), text)


def test_hermes_required_tag_pins_strict_arguments() -> None:
    tag = get_model_structural_tag(
        "hermes", resolve_tool_strictness(_tools(True), "required", ToolStrictLevel.AUTO),
        "required").model_dump()
    fmt = tag["format"]
    assert (fmt["type"], fmt["separator"], fmt["at_least_one"], fmt["stop_after_first"]) == \
        ("tags_with_separator", "", True, False)
    assert [(t["begin"], t["end"]) for t in fmt["tags"]] == [
        ('<tool_call>\n{"name": "get_weather", "arguments": ', "}\n</tool_call>"),
        ('<tool_call>{"name": "get_weather", "arguments": ', "}</tool_call>")]
    assert all(t["content"]["json_schema"] == SCHEMA for t in fmt["tags"])


def test_hermes_required_without_strict_leaves_arguments_free() -> None:
    tag = get_model_structural_tag(
        "hermes", resolve_tool_strictness(_tools(None), "required", ToolStrictLevel.AUTO),
        "required")
    assert all(t["content"]["json_schema"] is True for t in tag.model_dump()["format"]["tags"])


@pytest.mark.parametrize("model", ["hermes", "llama", "qwen_3_coder"])
def test_auto_without_strict_tools_has_no_tag(model) -> None:
    assert resolve_tool_strictness(_tools(None), "auto", ToolStrictLevel.AUTO) is None
    assert resolve_tool_strictness(_tools(False), "auto", ToolStrictLevel.AUTO) is None
    assert tool_structural_tag(model, _tools(None), "auto", None, None) is None


def test_strict_false_relaxes_the_arguments() -> None:
    assert get_function_parameters({"parameters": SCHEMA, "strict": False}) is True
    assert get_function_parameters({"parameters": SCHEMA, "strict": True}) == SCHEMA
    assert get_function_parameters({"name": "f"}) is True


def test_levels_pin_what_they_name() -> None:
    def strict(level):
        return [t["function"]["strict"]
                for t in resolve_tool_strictness(_tools(None), "auto", level)]

    assert strict(ToolStrictLevel.FUNCTION) == [False]
    assert strict(ToolStrictLevel.PARAMETER) == [True]


def test_hermes_auto_strict_allows_text_and_valid_calls_only() -> None:
    params = tool_structural_tag("hermes", _tools(True), "auto", None, None)
    assert params is not None
    assert _accepts(params, "It is sunny, no tool needed.")
    assert _accepts(params, "Let me check. " + _hermes('{"city": "Paris"}'))
    assert _accepts(params, _hermes('{"city": "Paris"}', newline=False))
    assert _accepts(params, _hermes('{"city": "Paris"}') + _hermes('{"city": "Lima"}'))
    assert not _accepts(params, _hermes('{"town": "Paris"}'))  # not the tool's schema
    assert not _accepts(params, _hermes('{"city": 3}'))
    assert not _accepts(params, '<tool_call>\n{"name": "other", "arguments": {}}\n</tool_call>')


def test_parallel_tool_calls_false_stops_after_one_call() -> None:
    params = tool_structural_tag("hermes", _tools(None), "auto", False, None)  # level FUNCTION
    assert params is not None
    assert _accepts(params, _hermes('{"town": 1}'))  # envelope only: arguments free
    assert not _accepts(params, _hermes('{"town": 1}') + _hermes('{"town": 2}'))


def test_auto_with_own_json_schema_is_a_call_or_that_json() -> None:
    own = StructuredOutputsParams(json={"type": "object", "properties": {
        "answer": {"type": "string"}}, "required": ["answer"]})
    params = tool_structural_tag("hermes", _tools(True), "auto", None, own)
    assert params is not None
    assert _accepts(params, '{"answer": "sunny"}')
    assert _accepts(params, _hermes('{"city": "Paris"}'))
    assert not _accepts(params, "free text")
    assert not _accepts(params, '{"other": 1}')


def test_own_constraint_xgrammar_cannot_take_keeps_the_request_alone(caplog) -> None:
    legacy = StructuredOutputsParams(structural_tag=json.dumps(
        {"structures": [{"begin": "<a>", "schema": {}, "end": "</a>"}], "triggers": ["<a>"]}))
    assert tool_structural_tag("hermes", _tools(True), "auto", None, legacy) is None
    assert "not constrained" in caplog.text


@pytest.mark.parametrize("model,call", [
    ("llama", '{"name": "get_weather", "parameters": {"city": "Paris"}}'),
    ("qwen_3_coder", "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
     "</parameter>\n</function>\n</tool_call>"),
])
def test_xgrammar_builtin_templates_take_their_syntax(model, call) -> None:
    params = tool_structural_tag(model, _tools(True), "auto", None, None)
    assert _accepts(params, call)
    assert not _accepts(params, call.replace("city", "town"))


@pytest.mark.parametrize("value", ["0", "false", "False", "no"])
def test_disabled_by_the_environment(monkeypatch, value) -> None:
    """vllm/envs.py reads the variable as true / 1 (any case) or off."""
    monkeypatch.setenv("VLLM_ENFORCE_STRICT_TOOL_CALLING", value)
    assert tool_structural_tag("hermes", _tools(True), "auto", None, None) is None
    monkeypatch.setenv("VLLM_ENFORCE_STRICT_TOOL_CALLING", "TRUE")
    assert tool_structural_tag("hermes", _tools(True), "auto", None, None) is not None


def test_strict_reads_as_the_request_validation_does() -> None:
    """ChatCompletionToolsParam takes "strict": "true" / 1 as True (pydantic's lax bool)."""
    for value in ("true", 1):
        tools = [{"type": "function", "function": {"name": "get_weather",
                                                   "parameters": SCHEMA, "strict": value}}]
        params = tool_structural_tag("hermes", tools, "auto", None, None)
        assert params is not None and not _accepts(params, _hermes('{"city": 1}'))


def test_own_schema_xgrammar_would_not_enforce_keeps_the_request_alone(caplog) -> None:
    """uniqueItems compiles in xgrammar but is not enforced there (vLLM's
    has_xgrammar_unsupported_json_features): the request's own constraint alone, for the
    backend `auto` to hand to guidance."""
    own = StructuredOutputsParams(json={"type": "array", "uniqueItems": True})
    assert tool_structural_tag("hermes", _tools(True), "auto", None, own) is None


def test_a_quoted_tool_name_is_escaped_in_the_call() -> None:
    tools = [{"type": "function", "function": {"name": 'say "hi"', "parameters": SCHEMA,
                                               "strict": True}}]
    params = tool_structural_tag("hermes", tools, "required", None, None)
    call = '<tool_call>\n' + json.dumps({"name": 'say "hi"', "arguments": {"city": "X"}}) + \
        '\n</tool_call>'
    assert _accepts(params, call)


def test_deeply_nested_tool_schemas_are_refused() -> None:
    deep: dict = {"type": "object"}
    for _ in range(200):
        deep = {"type": "object", "properties": {"a": deep}}
    tools = [{"type": "function", "function": {"name": "f", "parameters": deep,
                                               "strict": True}}]
    with pytest.raises(InvalidArgumentError):
        tool_structural_tag("hermes", tools, "auto", None, None)


def test_chat_request_carries_the_tag_to_the_engine(tokenizer) -> None:  # noqa: F811
    """/v1/chat/completions: tool_choice auto (the default with tools) with a strict tool
    submits the hermes structural tag; without strict, none; required submits the tag of
    one or more calls and the hermes parser reads them."""
    seen = []
    client = ScriptedClient(tokenizer, _hermes('{"city": "Paris"}'))
    add = client.add_request
    client.add_request = lambda rid, prompt, params, **kw: \
        seen.append(params.structured_outputs) or add(rid, prompt, params, **kw)
    choice = chat(client, False, tools=_tools(True))
    assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == \
        {"city": "Paris"}
    assert _accepts(seen[0], _hermes('{"city": "Paris"}'))
    assert not _accepts(seen[0], _hermes('{"city": 1}'))
    chat(client, False, tools=_tools(None))
    assert seen[1] is None
    choice = chat(client, False, tools=_tools(None), tool_choice="required")
    assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == \
        {"city": "Paris"}  # parsed by the hermes parser, as vLLM with structural tags
    assert _accepts(seen[2], _hermes('{"town": 1}')) and not _accepts(seen[2], "text")


def test_server_level_function_constrains_every_call(tokenizer) -> None:  # noqa: F811
    """--tool-strict-level function: the envelope (a known tool's name) for every request
    with tools, arguments free unless the tool is strict; parameter: every tool strict."""
    seen = []
    client = ScriptedClient(tokenizer, "Hello!")
    add = client.add_request
    client.add_request = lambda rid, prompt, params, **kw: \
        seen.append(params.structured_outputs) or add(rid, prompt, params, **kw)
    client.engine.config = replace(client.engine.config, tool_strict_level="function")
    chat(client, False, tools=_tools(None))
    assert _accepts(seen[0], _hermes('{"town": 1}'))
    assert not _accepts(seen[0], '<tool_call>\n{"name": "other", "arguments": {}}\n</tool_call>')
    client.engine.config = replace(client.engine.config, tool_strict_level="parameter")
    chat(client, False, tools=_tools(None))
    assert not _accepts(seen[1], _hermes('{"town": 1}'))
    assert _accepts(seen[1], _hermes('{"city": "Oslo"}'))


def test_unknown_level_is_refused_with_vllms_message() -> None:
    with pytest.raises(InvalidArgumentError, match=r"Unknown tool strict level 'nope'; "
                       r"expected one of auto, function, parameter\."):
        ToolStrictLevel.from_name("nope")
    assert ToolStrictLevel.from_name(" Function ") == ToolStrictLevel.FUNCTION


def test_server_flag_reaches_the_engine_params() -> None:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples", "server"))
    import server

    args = server.parse_args(["m.gguf", "--tool-strict-level", "parameter"])
    assert server.engine_fields(args)["tool_strict_level"] == "parameter"
    assert server.engine_fields(server.parse_args(["m.gguf"]))["tool_strict_level"] is None


TWO_TOOLS = _tools(True) + [{"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"type": "string"}}, "required": ["zone"]}}}]
NAMED_TIME = {"type": "function", "function": {"name": "get_time"}}


def test_required_is_one_or_more_calls_and_nothing_else() -> None:
    params = tool_structural_tag("hermes", TWO_TOOLS, "required", None, None)
    assert _accepts(params, _hermes('{"city": "Paris"}'))
    assert _accepts(params, _hermes('{"city": "Paris"}') + _hermes('{"city": "Oslo"}'))
    time_call = '<tool_call>\n{"name": "get_time", "arguments": {"any": 1}}\n</tool_call>'
    assert _accepts(params, time_call)  # get_time is not strict: arguments free
    assert not _accepts(params, _hermes('{"city": 1}'))  # get_weather is strict
    assert not _accepts(params, "No call.")
    assert not _accepts(params, "")


def test_named_choice_is_one_call_of_that_tool() -> None:
    params = tool_structural_tag("hermes", TWO_TOOLS, NAMED_TIME, None, None)
    call = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'
    assert _accepts(params, call)
    assert not _accepts(params, call + call)
    assert not _accepts(params, _hermes('{"city": "Paris"}'))
    llama = tool_structural_tag("llama", TWO_TOOLS, NAMED_TIME, None, None)
    assert _accepts(llama, '{"name": "get_time", "parameters": {"zone": "UTC"}}')
    assert not _accepts(llama, '{"name": "get_weather", "parameters": {"city": "Paris"}}')


def test_forced_choice_ignores_the_requests_own_constraint(caplog) -> None:
    own = StructuredOutputsParams(json={"type": "object"})
    params = tool_structural_tag("hermes", TWO_TOOLS, "required", None, own)
    assert not _accepts(params, "{}") and _accepts(params, _hermes('{"city": "Paris"}'))
    assert "ignored because tool_choice forces tool call" in caplog.text


def test_forced_choices_without_a_tag_model_keep_the_json_schema(tokenizer,  # noqa: F811
                                                                 monkeypatch) -> None:
    """VLLM_ENFORCE_STRICT_TOOL_CALLING=0: required is vLLM's JSON array schema again; so
    it is with --structured-outputs-backend guidance, and auto is unconstrained there."""
    seen = []
    client = ScriptedClient(tokenizer, '<think>Forced.</think>\n\n'
                            '[{"name": "get_weather", "parameters": {"city": "X"}}]')
    add = client.add_request
    client.add_request = lambda rid, prompt, params, **kw: \
        seen.append(params.structured_outputs) or add(rid, prompt, params, **kw)
    monkeypatch.setenv("VLLM_ENFORCE_STRICT_TOOL_CALLING", "0")
    choice = chat(client, False, tools=_tools(True), tool_choice="required")
    assert seen[0].json is not None and seen[0].structural_tag is None, choice
    assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == \
        {"city": "X"}
    monkeypatch.delenv("VLLM_ENFORCE_STRICT_TOOL_CALLING")  # guidance reads no xgrammar tag
    client.engine.config = replace(client.engine.config, structured_outputs_backend="guidance")
    chat(client, False, tools=_tools(True), tool_choice="required")
    chat(client, False, tools=_tools(True))
    assert seen[1].json is not None and seen[2] is None


def test_server_reasoning_config_flag() -> None:
    """vLLM's --reasoning-config JSON -> the parser and the thinking-budget markers."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples", "server"))
    import server

    args = server.parse_args(["m.gguf", "--reasoning-config", json.dumps({
        "reasoning_parser": "qwen3", "reasoning_end_str": "Done.</think>"})])
    fields = server.engine_fields(args)
    assert (fields["reasoning_parser"], fields["reasoning_start_str"],
            fields["reasoning_end_str"]) == ("qwen3", None, "Done.</think>")
    with pytest.raises(SystemExit):
        server.parse_args(["m.gguf", "--reasoning-config", '{"reasoning_start": "<"}'])
