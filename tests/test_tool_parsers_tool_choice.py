"""tool_choice "required" / named: the JSON schema that enforces it (checked by compiling it
with xgrammar and asking whether sample outputs are accepted), the non-streaming parse of
the constrained output, and the streaming of its tool-call deltas.

Mirrors vLLM 0.33 tests/tool_use/test_tool_choice_required.py (upstream compiles the schema
with outlines' regex builder; the accept/reject expectations are the same) plus the
required/named branches of vllm/parser/abstract_parser.py.
"""

from __future__ import annotations

import json
from copy import deepcopy

import pytest
from xgrammar import Grammar
from xgrammar.testing import _is_grammar_accept_string

from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.tool_parsers.streaming import (
    extract_named_tool_call_streaming,
    extract_required_tool_call_streaming,
)
from libvllm.engine.tool_parsers.tool_choice import extract_forced_tool_calls
from libvllm.engine.tool_parsers.tool_choice_schema import get_json_schema_from_tools

EXAMPLE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_current_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_forecast",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city", "days"],
                "additionalProperties": False,
            },
        },
    },
]
NAMED = {"type": "function", "function": {"name": "get_current_weather"}}
VALID_TOOLS = [
    [{"name": "get_current_weather", "parameters": {"city": "Vienna"}}],
    [
        {"name": "get_current_weather", "parameters": {"city": "Vienna"}},
        {"name": "get_current_weather", "parameters": {"city": "Berlin"}},
    ],
    [{"name": "get_forecast", "parameters": {"city": "Vienna", "days": 7}}],
    [
        {"name": "get_forecast", "parameters": {"city": "Vienna", "days": 7}},
        {"name": "get_current_weather", "parameters": {"city": "Vienna"}},
        {"name": "get_forecast", "parameters": {"city": "Berlin", "days": 7}},
    ],
]


def _accepts(tools, sample, parallel_tool_calls=None) -> bool:
    schema = get_json_schema_from_tools("required", tools, parallel_tool_calls)
    return _is_grammar_accept_string(Grammar.from_json_schema(schema), json.dumps(sample))


@pytest.mark.parametrize(
    "sample, should_match",
    [(v, True) for v in VALID_TOOLS]
    + [
        (None, False),
        ([], False),
        ({}, False),
        ([{}], False),
        ([{"name": "get_current_weather"}], False),
        ([{"name": "get_current_weather", "parameters": {}}], False),
        ([{"name": "get_current_weather", "parameters": None}], False),
        ({"name": "get_current_weather", "parameters": {"city": "Vienna"}}, False),
        ([{"name": "get_current_weather", "parameters": {"city": "V", "extra": "x"}}], False),
        ([{"parameters": {"city": "Vienna"}, "name": "get_current_weather"}], False),
        ([{"name": "get_forecast", "parameters": {"city": "Vienna"}}], False),
        ([{"name": "get_weather", "parameters": {"city": "Vienna", "days": 7}}], False),
        ([{"name": "get_current_weather", "parameters": {"city": "Vienna"}}, {}], False),
    ],
)
def test_structured_outputs_json(sample, should_match):
    assert _accepts(EXAMPLE_TOOLS, sample) == should_match


@pytest.mark.parametrize("params", [None, {}])
@pytest.mark.parametrize(
    "sample, should_match",
    [
        ([{"name": "get_current_weather", "parameters": None}], False),
        ([{"name": "get_current_weather", "parameters": {"extra": "value"}}], False),
        ([{"name": "get_current_weather", "parameters": {}}], True),
    ],
)
def test_structured_outputs_json_without_parameters(params, sample, should_match):
    tools = deepcopy(EXAMPLE_TOOLS[:1])
    tools[0]["function"]["parameters"] = params
    assert _accepts(tools, sample) == should_match


def test_parallel_tool_calls_false_allows_one_call():
    assert _accepts(EXAMPLE_TOOLS, VALID_TOOLS[0], parallel_tool_calls=False)
    assert not _accepts(EXAMPLE_TOOLS, VALID_TOOLS[1], parallel_tool_calls=False)
    for parallel, expected in [(False, 1), (True, None), (None, None)]:
        schema = get_json_schema_from_tools("required", EXAMPLE_TOOLS, parallel)
        assert schema["minItems"] == 1 and schema.get("maxItems") == expected


def test_named_and_other_choices():
    schema = get_json_schema_from_tools(NAMED, EXAMPLE_TOOLS, parallel_tool_calls=False)
    assert schema == EXAMPLE_TOOLS[0]["function"]["parameters"]
    responses_named = {"type": "function", "name": "get_forecast"}
    assert get_json_schema_from_tools(responses_named, EXAMPLE_TOOLS)["required"] == [
        "city",
        "days",
    ]
    assert get_json_schema_from_tools("auto", EXAMPLE_TOOLS) is None
    assert get_json_schema_from_tools("none", EXAMPLE_TOOLS) is None
    with pytest.raises(InvalidArgumentError, match="'nope' has not been passed in `tools`"):
        get_json_schema_from_tools(
            {"type": "function", "function": {"name": "nope"}}, EXAMPLE_TOOLS
        )
    with pytest.raises(InvalidArgumentError, match="no function tool"):
        get_json_schema_from_tools("required", [{"type": "web_search"}])


@pytest.mark.parametrize("params", [None, {}])
def test_named_empty_params_constrains_object(params):
    tool = {"type": "function", "function": {"name": "ping", "parameters": params}}
    choice = {"type": "function", "function": {"name": "ping"}}
    assert get_json_schema_from_tools(choice, [tool]) == {"type": "object", "properties": {}}


def _tool(params: dict) -> dict:
    return {"type": "function", "function": {"name": "get_weather", "parameters": params}}


@pytest.mark.parametrize("defs", [None, [], "nope", 1])
def test_non_object_defs_is_a_client_error(defs):
    tools = [_tool({"type": "object", "properties": {"a": {}}, "$defs": defs})]
    with pytest.raises(InvalidArgumentError, match=r"\$defs.*get_weather"):
        get_json_schema_from_tools("required", tools)


def test_defs_hoisted_and_duplicates_rejected():
    first = _tool(
        {
            "type": "object",
            "properties": {"a": {"$ref": "#/$defs/D"}},
            "$defs": {"D": {"type": "string"}},
        }
    )
    schema = get_json_schema_from_tools("required", [first])
    assert schema["$defs"] == {"D": {"type": "string"}}
    assert "$defs" in first["function"]["parameters"]  # the request's tools are left alone
    second = _tool(
        {
            "type": "object",
            "properties": {"b": {"$ref": "#/$defs/D"}},
            "$defs": {"D": {"type": "integer"}},
        }
    )
    with pytest.raises(InvalidArgumentError, match="multiple schemas"):
        get_json_schema_from_tools("required", [first, second])


def test_extract_forced_tool_calls():
    calls = extract_forced_tool_calls(json.dumps(VALID_TOOLS[1]), "required")
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_current_weather", {"city": "Vienna"}),
        ("get_current_weather", {"city": "Berlin"}),
    ]
    assert extract_forced_tool_calls("not json", "required") == []
    assert extract_forced_tool_calls('[{"name": 1}]', "required") == []
    named = extract_forced_tool_calls('{"city": "Oslo"}', NAMED)
    assert [(c.function.name, c.function.arguments) for c in named] == [
        ("get_current_weather", '{"city": "Oslo"}')
    ]
    assert extract_forced_tool_calls("  ", NAMED) == []


# ---- streaming (tool_parsers/streaming.py) ---------------------------------------------------


def _stream_required(output_json: str, deltas: list[str]) -> list[dict]:
    """Feed the deltas and rebuild the calls, checking each index gets id/name once first."""
    assert "".join(deltas) == output_json
    previous, calls = "", {}
    for delta in deltas:
        message, _ = extract_required_tool_call_streaming(
            previous_text=previous, current_text=previous + delta
        )
        previous += delta
        for tc in message.tool_calls if message else []:
            if tc.id is not None:
                assert tc.index not in calls and tc.type == "function" and tc.function.name
                calls[tc.index] = {"name": tc.function.name, "arguments": tc.function.arguments}
            else:
                assert tc.index in calls and tc.function.name is None and tc.function.arguments
                calls[tc.index]["arguments"] += tc.function.arguments
    assert list(calls) == list(range(len(calls)))
    return [calls[i] for i in range(len(calls))]


def _fixed(text: str, n: int) -> list[str]:
    return [text[i : i + n] for i in range(0, len(text), n)]


def _assert_streams_to(output: list[dict], deltas: list[str]) -> None:
    calls = _stream_required(json.dumps(output), deltas)
    assert [c["name"] for c in calls] == [o["name"] for o in output]
    assert [c["arguments"] for c in calls] == [json.dumps(o["parameters"]) for o in output]


@pytest.mark.parametrize("output", VALID_TOOLS)
@pytest.mark.parametrize("empty_params", [False, True])
@pytest.mark.parametrize("delta_len", [1, 2, 3, 5, 8, 10])
def test_streaming_output_valid(output, empty_params, delta_len):
    if empty_params:
        output = [{"name": o["name"], "parameters": {}} for o in output]
    _assert_streams_to(output, _fixed(json.dumps(output), delta_len))


@pytest.mark.parametrize(
    "city",
    [
        "a { b",
        "a } b",
        "a }} b",
        'a " } b',
        r"a \ } b",
        '"}}, {"name": "get_forecast", "parameters": {"city": "x',
    ],
)
@pytest.mark.parametrize("delta_len", [1, 2, 3, 8, 9999])
def test_streaming_output_valid_with_braces_in_string(city, delta_len):
    output = [
        {"name": "get_current_weather", "parameters": {"city": city}},
        {"name": "get_forecast", "parameters": {"city": city, "days": 1}},
    ]
    _assert_streams_to(output, _fixed(json.dumps(output), delta_len))


def test_streaming_trailing_data_and_boundaries():
    output = VALID_TOOLS[0]
    text = json.dumps(output) + "\nDONE"
    assert [c["name"] for c in _stream_required(text, _fixed(text, 3))] == [output[0]["name"]]
    two = [
        {"name": "get_current_weather", "parameters": {"city": "Dallas"}},
        {"name": "get_forecast", "parameters": {"city": "Dallas", "days": 3}},
    ]
    text = json.dumps(two)
    _assert_streams_to(two, [text[:1], text[1:]])
    _assert_streams_to(two, [text])
    boundary = text.index("}, {") + 1
    name_end = text.index('"get_forecast"') + 6
    for cuts in ([boundary - 1, name_end], [boundary - 2, boundary + 2], [boundary + 2]):
        bounds = [0, *cuts, len(text)]
        _assert_streams_to(two, [text[a:b] for a, b in zip(bounds, bounds[1:])])


def test_streaming_invalid_name_string_is_never_announced():
    text = '[{"name": "bad\\x", "parameters": {"city": "x"}}]'
    assert _stream_required(text, _fixed(text, 4)) == []


def test_named_streaming():
    first, sent = extract_named_tool_call_streaming(
        delta_text='{"ci', function_name="get_weather", function_name_returned=False
    )
    later, _ = extract_named_tool_call_streaming(
        delta_text='ty": "Oslo"}', function_name="get_weather", function_name_returned=sent
    )
    head, tail = first.tool_calls[0], later.tool_calls[0]
    assert head.id and head.type == "function" and head.function.name == "get_weather"
    assert tail.id is None and tail.function.name is None
    assert json.loads(head.function.arguments + tail.function.arguments) == {"city": "Oslo"}
