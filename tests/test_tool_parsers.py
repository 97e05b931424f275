"""Tool-call parsers (hermes, llama3_json, pythonic, mistral pre-v11 and v11, qwen3_xml) on
recorded model-style outputs, non-streaming and streamed token by token or in chunks.

Oracles: the expected calls/contents of the upstream tests ported here, and for streaming the
reconstruction contract: per index exactly one first delta with id, type "function" and the
whole name, later deltas only argument text, the concatenation equal to the non-streaming
arguments (valid JSON). Mirrors vLLM 0.33 tests/tool_parsers/{common_tests.py (the common
suite, with our per-parser outputs), utils.py (the reconstructor), test_hermes_tool_parser.py,
test_llama3_json_tool_parser.py, test_pythonic_tool_parser.py,
test_qwen3coder_tool_parser.py} and tests/parser/mistral/test_tool_calls.py. Upstream streams
through the real Qwen/Llama/Mistral tokenizers; here the default model's tokenizer carries
their markers as added control tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import NoneType
from typing import Any
from unittest.mock import MagicMock, patch

import pytest
from tokenizers.decoders import DecodeStream

from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.gguf.reader import GGUFReader
from libvllm.engine.tokenizer import Tokenizer
from libvllm.engine.tool_parsers import ToolParser, ToolParserManager
from libvllm.engine.tool_parsers.protocol import DeltaMessage, FunctionCall, ToolCall

MARKERS = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<|python_tag|>",
    "[TOOL_CALLS]",
    "[ARGS]",
]


def _tokenizer(model_path: str, markers: list[str]) -> Tokenizer:
    """The default model's tokenizer with `markers` appended as control tokens."""
    reader = GGUFReader(model_path)
    md = dict(reader.metadata)
    reader.close()
    md["tokenizer.ggml.tokens"] = [*md["tokenizer.ggml.tokens"], *markers]
    md["tokenizer.ggml.token_type"] = [*md["tokenizer.ggml.token_type"], *[3] * len(markers)]
    return Tokenizer.from_gguf_metadata(md)


@pytest.fixture(scope="module")
def tokenizer(model_path) -> Tokenizer:
    return _tokenizer(model_path, MARKERS)


@pytest.fixture(scope="module")
def pre_v11_tokenizer(model_path) -> Tokenizer:
    return _tokenizer(model_path, [m for m in MARKERS if m != "[ARGS]"])


# ---- tests/tool_parsers/utils.py -------------------------------------------------------------


class StreamingToolReconstructor:
    def __init__(self, assert_one_tool_per_delta: bool = True) -> None:
        self.tool_calls: list[ToolCall] = []
        self.other_content = ""
        self.one_tool = assert_one_tool_per_delta

    def append_delta(self, delta: DeltaMessage) -> None:
        assert not delta.role
        if delta.content is not None:
            self.other_content += delta.content
        else:
            assert delta.tool_calls, "a delta has content or tool calls (or both)"
        if self.one_tool:
            assert len(delta.tool_calls) < 2, "one tool call per update"
        for call in delta.tool_calls:
            assert call.type in (None, "function") and call.function is not None
            if call.index < len(self.tool_calls):
                assert not call.function.name, "the name is sent exactly once"
                assert not call.id, "the id is sent exactly once"
                assert call.index == len(self.tool_calls) - 1, "updates go to the last tool"
                assert call.function.arguments is not None
                self.tool_calls[call.index].function.arguments += call.function.arguments
            else:
                assert call.id is not None and call.function.name is not None
                assert call.index == len(self.tool_calls)
                self.tool_calls.append(
                    ToolCall(
                        id=call.id,
                        function=FunctionCall(
                            name=call.function.name, arguments=call.function.arguments or ""
                        ),
                    )
                )


def token_deltas(tokenizer: Tokenizer, text: str, interval: int = 1):
    """(delta_text, delta_ids) per `interval` tokens, detokenized incrementally."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    stream = DecodeStream(skip_special_tokens=False)
    for start in range(0, len(ids), interval):
        chunk = ids[start : start + interval]
        text_parts = [stream.step(tokenizer.backend, i) for i in chunk]
        yield "".join(p for p in text_parts if p), chunk


def run_streaming(
    parser: ToolParser,
    output: str | list[str],
    request: Any = None,
    interval: int = 1,
    one_tool: bool = True,
) -> StreamingToolReconstructor:
    if isinstance(output, str):
        deltas = list(token_deltas(parser.model_tokenizer, output, interval))
    else:
        deltas = [(d, parser.model_tokenizer.encode(d, add_special_tokens=False)) for d in output]
    rec = StreamingToolReconstructor(one_tool)
    previous, previous_ids = "", []
    for delta, delta_ids in deltas:
        current, current_ids = previous + delta, previous_ids + delta_ids
        message = parser.extract_tool_calls_streaming(
            previous, current, delta, previous_ids, current_ids, delta_ids, request
        )
        if message is not None:
            rec.append_delta(message)
        previous, previous_ids = current, current_ids
    return rec


def run_extraction(parser: ToolParser, output: str, streaming: bool, request: Any = None):
    if streaming:
        rec = run_streaming(parser, output, request)
        return rec.other_content or None, rec.tool_calls
    extracted = parser.extract_tool_calls(output, request)
    assert extracted.tools_called == bool(extracted.tool_calls)
    return extracted.content, extracted.tool_calls


def _parser(name: str, tokenizer: Tokenizer, tools: list | None = None) -> ToolParser:
    return ToolParserManager.get_tool_parser(name)(tokenizer, tools)


# ---- tests/tool_parsers/common_tests.py, with our parsers' outputs ------------------------------

VARIOUS = {
    "string_field": "hello",
    "int_field": 42,
    "float_field": 3.14,
    "bool_field": True,
    "null_field": None,
    "array_field": ["a", "b", "c"],
    "object_field": {"nested": "v"},
}
ESCAPED = {"quoted": 'He said "hello"', "path": "C:\\Users\\file.txt", "newline": "a\nb"}


def _qwen3_call(name: str, args: dict) -> str:
    params = "".join(
        f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n"
        for k, v in args.items()
    )
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def _schema_tool(name: str, example: dict) -> dict:
    kinds = {
        str: "string",
        int: "integer",
        float: "number",
        bool: "boolean",
        NoneType: "null",
        list: "array",
        dict: "object",
    }
    props = {k: {"type": kinds[type(v)]} for k, v in example.items()}
    return {
        "type": "function",
        "function": {"name": name, "parameters": {"type": "object", "properties": props}},
    }


@dataclass
class Config:
    parser_name: str
    no_tool_calls: str
    single: str
    parallel: str
    various: str
    empty_args: str
    surrounding: str
    escaped: str
    malformed: list[str]
    single_content: str | None = None
    pre_v11: bool = False
    tools: list | None = None
    xfail_streaming: dict[str, str] = field(default_factory=dict)
    xfail_nonstreaming: dict[str, str] = field(default_factory=dict)


def _hermes(args_name: str, name: str, args: dict) -> str:
    return f'<tool_call>\n{{"name": "{name}", "{args_name}": {json.dumps(args)}}}\n</tool_call>'


def _json(name: str, args: dict, key: str = "arguments") -> str:
    return json.dumps({"name": name, key: args})


def _py(name: str, args: dict) -> str:
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in args.items())})"


W, T = ("get_weather", {"city": "Tokyo"}), ("get_time", {"timezone": "Asia/Tokyo"})
PLAIN = "This is a regular response without any tool calls."
CONFIGS = {
    "hermes": Config(
        "hermes",
        PLAIN,
        _hermes("arguments", *W),
        _hermes("arguments", *W) + "\n" + _hermes("arguments", *T),
        _hermes("arguments", "test_function", VARIOUS),
        _hermes("arguments", "refresh", {}),
        "Let me check the weather for you. " + _hermes("arguments", *W),
        _hermes("arguments", "test_function", ESCAPED),
        [
            '<tool_call>\n{"name": "func", "arguments": {',
            "</tool_call>",
            "<tool_call>not json</tool_call>",
        ],
    ),
    "llama3_json": Config(
        "llama3_json",
        PLAIN,
        _json(*W, "parameters"),
        _json(*W, "parameters") + "; " + _json(*T, "parameters"),
        _json("test_function", VARIOUS),
        _json("refresh", {}, "parameters"),
        "Here is the call: " + _json(*W),
        _json("test_function", ESCAPED),
        ['{"name": "func", "parameters": {', '{"parameters": {}}', "{not json}"],
        xfail_streaming={
            "surrounding": "upstream streams calls only when the text starts "
            "with { or <|python_tag|>"
        },
    ),
    "pythonic": Config(
        "pythonic",
        PLAIN,
        f"[{_py(*W)}]",
        f"[{_py(*W)}, {_py(*T)}]",
        "[test_function(string_field='hello', int_field=42, float_field=3.14, "
        "bool_field=True, null_field=None, array_field=['a', 'b', 'c'], "
        "object_field={'nested': 'v'})]",
        "[refresh()]",
        f"Sure: [{_py(*W)}]",
        f"[{_py('test_function', ESCAPED)}]",
        ["[get_weather(city=", "[1 + 2]", "[f(x=y)]"],
        xfail_streaming={"surrounding": "pythonic calls must start the output (upstream)"},
        xfail_nonstreaming={"surrounding": "pythonic calls must start the output (upstream)"},
    ),
    "mistral_pre_v11": Config(
        "mistral",
        PLAIN,
        "[TOOL_CALLS][" + _json(*W) + "]",
        "[TOOL_CALLS][" + _json(*W) + ", " + _json(*T) + "]",
        "[TOOL_CALLS][" + _json("test_function", VARIOUS) + "]",
        '[TOOL_CALLS][{"name": "refresh", "arguments": {}}]',
        "Let me check. [TOOL_CALLS][" + _json(*W) + "]",
        "[TOOL_CALLS][" + _json("test_function", ESCAPED) + "]",
        ["[TOOL_CALLS][{", "[TOOL_CALLS] not json", "[TOOL_CALLS][1, 2]"],
        pre_v11=True,
    ),
    "mistral_v11": Config(
        "mistral",
        PLAIN,
        f"[TOOL_CALLS]{W[0]}[ARGS]{json.dumps(W[1])}",
        f"[TOOL_CALLS]{W[0]}[ARGS]{json.dumps(W[1])}[TOOL_CALLS]{T[0]}[ARGS]{json.dumps(T[1])}",
        f"[TOOL_CALLS]test_function[ARGS]{json.dumps(VARIOUS)}",
        "[TOOL_CALLS]refresh[ARGS]{}",
        f"Let me check. [TOOL_CALLS]{W[0]}[ARGS]{json.dumps(W[1])}",
        f"[TOOL_CALLS]test_function[ARGS]{json.dumps(ESCAPED)}",
        ["[TOOL_CALLS]", "[TOOL_CALLS]f[ARGS]{", "[ARGS]{}"],
    ),
    "qwen3_xml": Config(
        "qwen3_xml",
        PLAIN,
        _qwen3_call(*W),
        _qwen3_call(*W) + "\n" + _qwen3_call(*T),
        _qwen3_call("test_function", VARIOUS),
        "<tool_call>\n<function=refresh>\n</function>\n</tool_call>",
        "Let me check the weather for you. " + _qwen3_call(*W),
        _qwen3_call("test_function", ESCAPED),
        ["<tool_call>\n<function=", "<tool_call>\n<function=f\n</function>", "</tool_call>"],
        tools=[_schema_tool("test_function", VARIOUS), _schema_tool(*W), _schema_tool(*T)],
    ),
}


@pytest.fixture(params=list(CONFIGS))
def config(request) -> Config:
    return CONFIGS[request.param]


@pytest.fixture
def common_parser(config, tokenizer, pre_v11_tokenizer) -> ToolParser:
    tok = pre_v11_tokenizer if config.pre_v11 else tokenizer
    return _parser(config.parser_name, tok, config.tools)


@pytest.fixture(params=[True, False], ids=["streaming", "nonstreaming"])
def streaming(request) -> bool:
    return request.param


def _xfail(request, config: Config, name: str, streaming: bool) -> None:
    reason = (config.xfail_streaming if streaming else config.xfail_nonstreaming).get(name)
    if reason:
        request.node.add_marker(pytest.mark.xfail(reason=reason, strict=True))


class TestCommon:
    def test_no_tool_calls(self, common_parser, config, streaming):
        content, calls = run_extraction(common_parser, config.no_tool_calls, streaming)
        assert content == config.no_tool_calls and calls == []

    def test_single_tool_call(self, common_parser, config, streaming):
        content, calls = run_extraction(common_parser, config.single, streaming)
        assert content == config.single_content
        assert len(calls) == 1 and calls[0].type == "function"
        assert calls[0].function.name == "get_weather"
        assert json.loads(calls[0].function.arguments) == {"city": "Tokyo"}

    def test_parallel_tool_calls(self, common_parser, config, streaming):
        _, calls = run_extraction(common_parser, config.parallel, streaming)
        assert [c.function.name for c in calls] == ["get_weather", "get_time"]
        assert json.loads(calls[1].function.arguments) == {"timezone": "Asia/Tokyo"}
        assert len({c.id for c in calls}) == 2

    def test_various_data_types(self, common_parser, config, streaming):
        _, calls = run_extraction(common_parser, config.various, streaming)
        assert len(calls) == 1
        args = json.loads(calls[0].function.arguments)
        assert args == VARIOUS and all(type(args[k]) is type(v) for k, v in VARIOUS.items())

    def test_empty_arguments(self, common_parser, config, streaming):
        _, calls = run_extraction(common_parser, config.empty_args, streaming)
        assert len(calls) == 1 and calls[0].function.arguments in ("{}", "")

    def test_surrounding_text(self, request, common_parser, config, streaming):
        _xfail(request, config, "surrounding", streaming)
        _, calls = run_extraction(common_parser, config.surrounding, streaming)
        assert len(calls) >= 1

    def test_escaped_strings(self, common_parser, config, streaming):
        _, calls = run_extraction(common_parser, config.escaped, streaming)
        assert len(calls) == 1 and json.loads(calls[0].function.arguments) == ESCAPED

    def test_malformed_input(self, common_parser, config, streaming):
        for output in config.malformed:
            run_extraction(common_parser, output, streaming)  # never raises

    def test_streaming_reconstruction(self, config, tokenizer, pre_v11_tokenizer):
        tok = pre_v11_tokenizer if config.pre_v11 else tokenizer
        for output in (config.single, config.parallel, config.various):
            content, calls = run_extraction(
                _parser(config.parser_name, tok, config.tools), output, streaming=False
            )
            s_content, s_calls = run_extraction(
                _parser(config.parser_name, tok, config.tools), output, streaming=True
            )
            assert content == s_content
            assert [(c.function.name, c.function.arguments) for c in calls] == [
                (c.function.name, c.function.arguments) for c in s_calls
            ]

    @pytest.mark.parametrize("interval", [2, 3, 5, 9999])
    def test_chunked_streaming(self, config, tokenizer, pre_v11_tokenizer, interval):
        tok = pre_v11_tokenizer if config.pre_v11 else tokenizer
        parser = _parser(config.parser_name, tok, config.tools)
        rec = run_streaming(parser, config.parallel, interval=interval, one_tool=False)
        assert [c.function.name for c in rec.tool_calls] == ["get_weather", "get_time"]
        assert json.loads(rec.tool_calls[0].function.arguments) == {"city": "Tokyo"}


def test_registry_names():
    names = set(ToolParserManager.list_registered())
    assert {"hermes", "llama3_json", "mistral", "pythonic", "qwen3_xml", "qwen3_coder"} <= names
    with pytest.raises(KeyError, match="Tool parser 'nope' not found"):
        ToolParserManager.get_tool_parser("nope")


# ---- test_hermes_tool_parser.py ---------------------------------------------------------------


@pytest.fixture
def hermes(tokenizer):
    return _parser("hermes", tokenizer)


def test_hermes_streaming_just_forward_text(hermes):
    text = "This is some prior text that has nothing to do with tool calling."
    rec = run_streaming(hermes, text)
    assert rec.other_content == text and rec.tool_calls == []


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            '<tool_call>\n{"name": "final_answer", "arguments": {"trigger": true}}\n</tool_call>',
            {"trigger": True},
        ),
        (
            '<tool_call>{"name": "get_current_temperature","arguments": {"location":'
            '"San Francisco, California, United States", "unit": "celsius"}}</tool_call>',
            {"location": "San Francisco, California, United States", "unit": "celsius"},
        ),
    ],
    ids=["bug_19056", "no_spaces"],
)
@pytest.mark.parametrize("interval", [1, 2, 3, 5, 8])
def test_hermes_streaming(tokenizer, text, expected, interval):
    rec = run_streaming(_parser("hermes", tokenizer), text, interval=interval, one_tool=False)
    assert len(rec.tool_calls) == 1 and json.loads(rec.tool_calls[0].function.arguments) == expected


@pytest.mark.parametrize("interval", [1, 2, 3, 5, 8, 9999])
def test_hermes_streaming_content_then_tool_call(tokenizer, interval):
    text = (
        'Sure, let me check the weather.<tool_call>{"name": "get_weather", '
        '"arguments": {"city": "NYC"}}</tool_call>'
    )
    rec = run_streaming(_parser("hermes", tokenizer), text, interval=interval, one_tool=False)
    assert rec.other_content == "Sure, let me check the weather."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in rec.tool_calls] == [
        ("get_weather", {"city": "NYC"})
    ]


@pytest.mark.parametrize("interval", [1, 2, 4])
def test_hermes_streaming_multiple_tool_calls(tokenizer, interval):
    text = (
        '<tool_call>{"name": "search", "arguments": {"q": "cats"}}</tool_call>'
        '<tool_call>{"name": "search", "arguments": {"q": "dogs"}}</tool_call>'
    )
    rec = run_streaming(_parser("hermes", tokenizer), text, interval=interval, one_tool=False)
    assert [json.loads(c.function.arguments) for c in rec.tool_calls] == [
        {"q": "cats"},
        {"q": "dogs"},
    ]


def test_hermes_non_streaming(hermes):
    assert not hermes.extract_tool_calls("This is not a tool call.").tools_called
    between = '<tool_call>\n{"name": "final_answer", "arguments": {"trigger": true}}\n</tool_call>'
    for text in (between, between.removesuffix("\n</tool_call>")):  # until EOS too
        result = hermes.extract_tool_calls(text)
        assert result.tools_called and result.tool_calls[0].function.name == "final_answer"
        assert result.tool_calls[0].function.arguments == '{"trigger": true}'
    invalid = '<tool_call>\n{"name": "final_answer", "arguments": {"trigger": true}'
    assert not hermes.extract_tool_calls(invalid).tools_called


# ---- test_llama3_json_tool_parser.py ---------------------------------------------------------


@pytest.fixture
def llama(tokenizer):
    return _parser("llama3_json", tokenizer)


def test_llama_requires_python_tag(pre_v11_tokenizer, model_path):
    plain = _tokenizer(model_path, [])
    with pytest.raises(InvalidArgumentError, match="could not locate the bot token"):
        _parser("llama3_json", plain)


@pytest.mark.parametrize(
    "output, expected",
    [
        (
            'Here is the result: {"name": "getOpenIncidentsTool", "parameters": {}} Would you '
            "like to know more?",
            [("getOpenIncidentsTool", {})],
        ),
        (
            '{"name": "searchTool", "parameters": {"query": "test query", "limit": 10}}',
            [("searchTool", {"query": "test query", "limit": 10})],
        ),
        (
            '{"name": "searchTool", "arguments": {"query": "test"}}',
            [("searchTool", {"query": "test"})],
        ),
        (
            '{"name": "searchTool", "parameters": {"query": "test1"}} ; {"name": '
            '"getOpenIncidentsTool", "parameters": {}}; {"name": "searchTool", "parameters": '
            '{"query": "test2"}} Would you like to know more?',
            [
                ("searchTool", {"query": "test1"}),
                ("getOpenIncidentsTool", {}),
                ("searchTool", {"query": "test2"}),
            ],
        ),
        (
            '{"name": "complexTool", "parameters": {"level1": {"level2": {"level3": {"level4": '
            '{"value": "deep"}}}}}}',
            [("complexTool", {"level1": {"level2": {"level3": {"level4": {"value": "deep"}}}}})],
        ),
        (
            '{"name": "searchTool", "parameters": {"query": "test {value} [complex]","nested": '
            '{"inner": "more {brackets}"}}}',
            [
                (
                    "searchTool",
                    {"query": "test {value} [complex]", "nested": {"inner": "more {brackets}"}},
                )
            ],
        ),
        (
            '{"name": "parserTool", "parameters": {"text": "He said \\"Hello {world}\\""}}',
            [("parserTool", {"text": 'He said "Hello {world}"'})],
        ),
    ],
)
def test_llama_extract_tool_calls(llama, output, expected):
    result = llama.extract_tool_calls(output)
    assert result.tools_called and result.content is None
    assert [
        (c.function.name, json.loads(c.function.arguments)) for c in result.tool_calls
    ] == expected


@pytest.mark.parametrize(
    "output",
    [
        "This is just some text without any tool calls",
        '{"name": "invalidTool", "parameters": {invalid json}',
        '{"parameters": {}}',
        '{"name": "toolWithoutParams"}',
    ],
)
def test_llama_no_tool_calls(llama, output):
    result = llama.extract_tool_calls(output)
    assert not result.tools_called and result.content == output


def test_llama_regex_timeout_handling(llama):
    text = "{hello world[A(A=" + "\t)A(A=,\t" * 2
    mock_regex = MagicMock()
    mock_regex.finditer.side_effect = TimeoutError("Regex timeout")
    with patch.object(llama, "tool_call_start_regex", mock_regex):
        result = llama.extract_tool_calls(text)
    assert result.content == text and not result.tools_called
    mock_regex.finditer.assert_called_once()


# ---- test_pythonic_tool_parser.py -----------------------------------------------------------

SIMPLE = (
    "get_weather(city='San Francisco', metric='celsius')",
    FunctionCall(name="get_weather", arguments='{"city": "San Francisco", "metric": "celsius"}'),
)
MORE_TYPES = (
    "register_user(name='John Doe', age=37, address={'city': 'San Francisco', "
    "'state': 'CA'}, role=None, passed_test=True, aliases=['John', 'Johnny'])",
    FunctionCall(
        name="register_user",
        arguments='{"name": "John Doe", "age": 37, '
        '"address": {"city": "San Francisco", "state": "CA"}, "role": null, '
        '"passed_test": true, "aliases": ["John", "Johnny"]}',
    ),
)
PARAMETERLESS = ("get_weather()", FunctionCall(name="get_weather", arguments="{}"))
EMPTY_DICT = (
    "do_something_cool(additional_data={})",
    FunctionCall(name="do_something_cool", arguments='{"additional_data": {}}'),
)
EMPTY_LIST = (
    "do_something_cool(steps=[])",
    FunctionCall(name="do_something_cool", arguments='{"steps": []}'),
)
ESCAPED_PY = (
    r"get_weather(city='Martha\'s Vineyard', metric='\"cool units\"')",
    FunctionCall(
        name="get_weather", arguments='{"city": "Martha\'s Vineyard", "metric": "\\"cool units\\""}'
    ),
)


@pytest.mark.parametrize("streaming", [True, False])
@pytest.mark.parametrize(
    "calls",
    [
        [SIMPLE],
        [MORE_TYPES],
        [PARAMETERLESS],
        [EMPTY_DICT],
        [EMPTY_LIST],
        [ESCAPED_PY],
        [SIMPLE, MORE_TYPES],
    ],
    ids=[
        "simple",
        "more_types",
        "parameterless",
        "empty_dict",
        "empty_list",
        "escaped",
        "parallel",
    ],
)
def test_pythonic_tool_call(tokenizer, streaming, calls):
    output = "[" + ", ".join(c[0] for c in calls) + "]"
    content, tool_calls = run_extraction(_parser("pythonic", tokenizer), output, streaming)
    assert content is None
    assert [t.function for t in tool_calls] == [c[1] for c in calls]


def test_pythonic_streaming_with_large_steps(tokenizer):
    deltas = [
        "[get_weather(city='San",
        f" Francisco', metric='celsius'), {PARAMETERLESS[0]}, {EMPTY_LIST[0]}]",
    ]
    rec = run_streaming(_parser("pythonic", tokenizer), deltas, one_tool=False)
    assert rec.other_content == ""
    assert [c.function for c in rec.tool_calls] == [SIMPLE[1], PARAMETERLESS[1], EMPTY_LIST[1]]


def test_pythonic_regex_timeout_handling(tokenizer):
    parser = _parser("pythonic", tokenizer)
    text = "hello world[A(A=" + "\t)A(A=,\t" * 2
    mock_regex = MagicMock()
    mock_regex.match.side_effect = TimeoutError("Regex timeout")
    with patch.object(parser, "TOOL_CALL_REGEX", mock_regex):
        result = parser.extract_tool_calls(text)
    assert result.content == text and not result.tools_called


# ---- tests/parser/mistral/test_tool_calls.py --------------------------------------------------


def _calls(result) -> list[tuple[str, str]]:
    return [(c.function.name, c.function.arguments) for c in result.tool_calls]


def _dumps(**kwargs) -> str:
    return json.dumps(kwargs)


SF = {"city": "San Francisco", "state": "CA", "unit": "celsius"}
PRE_V11_CASES = [
    (
        '[TOOL_CALLS][{"name": "add", "arguments":{"a": 3.5, "b": 4}}]',
        [("add", _dumps(a=3.5, b=4))],
        None,
    ),
    (
        '[TOOL_CALLS] [{"name": "get_current_weather", "arguments":' + json.dumps(SF) + "}]",
        [("get_current_weather", json.dumps(SF))],
        None,
    ),
    (
        '[TOOL_CALLS] [{"arguments":' + json.dumps(SF) + ', "name": "get_current_weather"}]',
        [("get_current_weather", json.dumps(SF))],
        None,
    ),
    (
        '[TOOL_CALLS] [{"arguments":{"name": "John Doe"}, "name": "get_age"}]',
        [("get_age", _dumps(name="John Doe"))],
        None,
    ),
    (
        '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 3.5, "b": 4}}, {"name": '
        '"get_current_weather", "arguments":' + json.dumps(SF) + "}]",
        [("add", _dumps(a=3.5, b=4)), ("get_current_weather", json.dumps(SF))],
        None,
    ),
    (
        'Hello[TOOL_CALLS] [{"name": "add", "arguments":{"a": 1, "b": 2}}]',
        [("add", _dumps(a=1, b=2))],
        "Hello",
    ),
    (
        '[TOOL_CALLS] [{"name": "get_current_weather", "arguments":{"city": "Dallas"}}]\nextra',
        [("get_current_weather", _dumps(city="Dallas"))],
        None,
    ),
]


@pytest.fixture
def mistral_pre_v11(pre_v11_tokenizer):
    return _parser("mistral", pre_v11_tokenizer)


@pytest.fixture
def mistral_v11(tokenizer):
    return _parser("mistral", tokenizer)


@pytest.mark.parametrize("output, expected, content", PRE_V11_CASES)
def test_mistral_pre_v11_extract(mistral_pre_v11, output, expected, content):
    result = mistral_pre_v11.extract_tool_calls(output)
    assert result.tools_called and _calls(result) == expected and result.content == content
    assert all(c.id.isalnum() and len(c.id) == 9 for c in result.tool_calls)


@pytest.mark.parametrize("output, expected, content", PRE_V11_CASES)
def test_mistral_pre_v11_streaming(pre_v11_tokenizer, output, expected, content):
    rec = run_streaming(_parser("mistral", pre_v11_tokenizer), output)
    assert [(c.function.name, c.function.arguments) for c in rec.tool_calls] == expected
    trailing = output.rsplit("]", 1)[1] if output.endswith("extra") else ""
    assert rec.other_content == (content or "") + trailing


def test_mistral_pre_v11_edge_cases(mistral_pre_v11):
    two_bots = (
        '[TOOL_CALLS] [{"name": "add", "arguments":{"a": 1}}]'
        '[TOOL_CALLS] [{"name": "sub", "arguments":{"b": 2}}]'
    )
    assert _calls(mistral_pre_v11.extract_tool_calls(two_bots)) == [("add", '{"a": 1}')]
    junk = '[TOOL_CALLS]  junk [{"name": "add", "arguments":{"a": 1, "b": 2}}] trail'
    assert _calls(mistral_pre_v11.extract_tool_calls(junk)) == [("add", _dumps(a=1, b=2))]
    for calls_text in ("not json at all", "42", '["add"]', '{"foo": 1}'):
        result = mistral_pre_v11.extract_tool_calls(f"[TOOL_CALLS] {calls_text}")
        assert not result.tools_called and result.content == calls_text


UNUSUAL = [
    ('[TOOL_CALLS] {"name": "add", "arguments": {"a": 1}}', [("add", '{"a": 1}')], ""),
    (
        '[TOOL_CALLS] {"name": "add", "arguments": {"a": 1}}, {"name": "sub", "arguments": '
        '{"b": 2}}',
        [("add", '{"a": 1}')],
        ', {"name": "sub", "arguments": {"b": 2}}',
    ),
    (
        '[TOOL_CALLS] {"arguments": {"a": 1}, "name": "add"}, {"name": "sub", "arguments": '
        '{"b": 2}}',
        [("add", '{"a": 1}')],
        ', {"name": "sub", "arguments": {"b": 2}}',
    ),
    (
        '[TOOL_CALLS] {"name": "add", "arguments": "{\\"a\\": 1}"}, {"name": "sub", '
        '"arguments": {"b": 2}}',
        [("add", '{"a": 1}')],
        ', {"name": "sub", "arguments": {"b": 2}}',
    ),
    ('[TOOL_CALLS] [{"arguments": {"a": 1}}]', [("", '{"a": 1}')], ""),
    (
        '[TOOL_CALLS] [{"name": "add", "arguments": "{\\"a\\": 1}"}, {"name": "sub", '
        '"arguments": {"b": 2}}]',
        [("add", '{"a": 1}'), ("sub", '{"b": 2}')],
        "",
    ),
    ('[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1}}, "junk"]', [("add", '{"a": 1}')], ""),
    (
        '[TOOL_CALLS] [TOOL_CALLS] [{"name": "add", "arguments": {"a": 1}}]',
        [("add", '{"a": 1}')],
        "",
    ),
    ('[TOOL_CALLS] [TOOL_CALLS] {"name": "add", "arguments": {"a": 1}}', [("add", '{"a": 1}')], ""),
]


@pytest.mark.parametrize("output, expected, streamed_content", UNUSUAL)
def test_mistral_pre_v11_unusual_calls(pre_v11_tokenizer, output, expected, streamed_content):
    result = _parser("mistral", pre_v11_tokenizer).extract_tool_calls(output)
    assert result.tools_called and _calls(result) == expected and result.content is None
    rec = run_streaming(_parser("mistral", pre_v11_tokenizer), output)
    assert [(c.function.name, c.function.arguments) for c in rec.tool_calls] == expected
    assert rec.other_content == streamed_content


COMMAND = {"command": "print(\"hello world!\")\nre.compile(r'{}')"}
V11_CASES = [
    (
        '[TOOL_CALLS]add_this_and_that{"a": 3.5, "b": 4}',
        [("add_this_and_that", _dumps(a=3.5, b=4))],
        None,
    ),
    (
        '[TOOL_CALLS]add{"a": 3.5, "b": 4}[TOOL_CALLS]multiply{"a": 3, "b": 6}',
        [("add", _dumps(a=3.5, b=4)), ("multiply", _dumps(a=3, b=6))],
        None,
    ),
    (
        "[TOOL_CALLS]get_current_weather[ARGS]" + json.dumps(SF),
        [("get_current_weather", json.dumps(SF))],
        None,
    ),
    (
        '[TOOL_CALLS]add[ARGS]{"a": 3.5, "b": 4}[TOOL_CALLS]multiply[ARGS]{"a": 3, "b": 6}',
        [("add", _dumps(a=3.5, b=4)), ("multiply", _dumps(a=3, b=6))],
        None,
    ),
    ('hi[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}', [("add", _dumps(a=1, b=2))], "hi"),
    (
        "hi{hi[TOOL_CALLS]bash" + json.dumps(COMMAND)[:-2],
        [("bash", json.dumps(COMMAND)[:-2])],
        "hi{hi",
    ),
    ("hi{hi[TOOL_CALLS]bash" + json.dumps(COMMAND), [("bash", json.dumps(COMMAND))], "hi{hi"),
    (
        '[TOOL_CALLS]get_current_weather{"city": "San Francisco"}Estimating the weather...',
        [("get_current_weather", _dumps(city="San Francisco"))],
        None,
    ),
    (
        '[TOOL_CALLS]get_current_weather[ARGS]{"city": "San Francisco"}Estimating...',
        [("get_current_weather", _dumps(city="San Francisco"))],
        None,
    ),
    ("[TOOL_CALLS]toolname_no_args", [("toolname_no_args", "{}")], None),
    ('bash[TOOL_CALLS]{"command": "cat file.py"}', [("", _dumps(command="cat file.py"))], "bash"),
    ("bash[TOOL_CALLS]{not valid json at all", [("", "{not valid json at all")], "bash"),
    (
        'bash[TOOL_CALLS]{"command": "ls"}[TOOL_CALLS]submit[ARGS]{"answer": {"nested": 1}}',
        [("", _dumps(command="ls")), ("submit", json.dumps({"answer": {"nested": 1}}))],
        "bash",
    ),
]


@pytest.mark.parametrize("output, expected, content", V11_CASES)
def test_mistral_v11_extract(mistral_v11, output, expected, content):
    result = mistral_v11.extract_tool_calls(output)
    assert result.tools_called and _calls(result) == expected and result.content == content


@pytest.mark.parametrize(
    "output, expected, content", [c for c in V11_CASES if "no_args" not in c[0]]
)
def test_mistral_v11_streaming(tokenizer, output, expected, content):
    rec = run_streaming(_parser("mistral", tokenizer), output)
    assert [(c.function.name, c.function.arguments) for c in rec.tool_calls] == expected
    assert (rec.other_content or None) == content


def test_mistral_tool_choice(pre_v11_tokenizer):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_current_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    parser = _parser("mistral", pre_v11_tokenizer, tools)
    output = '[{"name": "get_current_weather", "arguments": {"city": "Dallas"}}]'
    result = parser.extract_tool_calls(output, {"tool_choice": "required", "tools": tools})
    assert _calls(result) == [("get_current_weather", _dumps(city="Dallas"))]
    assert result.content is None and len(result.tool_calls[0].id) == 9
    marked = "[TOOL_CALLS] " + output
    result = parser.extract_tool_calls(marked, {"tool_choice": "none", "tools": tools})
    assert not result.tools_called and result.content == marked
    schema = parser.structured_outputs_for_tools("required").json
    assert schema["items"]["anyOf"][0]["properties"]["name"] == {
        "type": "string",
        "enum": ["get_current_weather"],
    }
    named = {"type": "function", "function": {"name": "get_current_weather"}}
    assert parser.structured_outputs_for_tools(named).json["maxItems"] == 1
    assert parser.structured_outputs_for_tools("auto") is None
    streamed = run_streaming(
        _parser("mistral", pre_v11_tokenizer, tools), output, {"tool_choice": "required"}
    )
    assert [(c.function.name, c.function.arguments) for c in streamed.tool_calls] == [
        ("get_current_weather", _dumps(city="Dallas"))
    ]


# ---- test_qwen3coder_tool_parser.py -----------------------------------------------------------

WEATHER_PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "state": {"type": "string"},
        "unit": {"type": "string", "enum": ["fahrenheit", "celsius"]},
    },
    "required": ["city", "state"],
}
AREA_PARAMS = {
    "type": "object",
    "properties": {
        "shape": {"type": "string"},
        "dimensions": {"type": "object"},
        "precision": {"type": "integer"},
    },
}
SAMPLE_TOOLS = [
    {"type": "function", "function": {"name": "get_current_weather", "parameters": WEATHER_PARAMS}},
    {"type": "function", "name": "calculate_area", "parameters": AREA_PARAMS},  # Responses
]


def _xml(name: str, params: list[tuple[str, str]]) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


DALLAS = _xml("get_current_weather", [("city", "Dallas"), ("state", "TX"), ("unit", "fahrenheit")])
ORLANDO = _xml(
    "get_current_weather", [("city", "Orlando"), ("state", "FL"), ("unit", "fahrenheit")]
)
QWEN3_CASES = [
    ("This is a test without tools", [], "This is a test without tools"),
    (
        DALLAS,
        [("get_current_weather", {"city": "Dallas", "state": "TX", "unit": "fahrenheit"})],
        None,
    ),
    (
        "Sure! Let me check the weather for you." + DALLAS,
        [("get_current_weather", {"city": "Dallas", "state": "TX", "unit": "fahrenheit"})],
        "Sure! Let me check the weather for you.",
    ),
    (
        _xml(
            "calculate_area",
            [
                ("shape", "rectangle"),
                ("dimensions", '{"width": 10, \n "height": 20}'),
                ("precision", "2"),
            ],
        ),
        [
            (
                "calculate_area",
                {"shape": "rectangle", "dimensions": {"width": 10, "height": 20}, "precision": 2},
            )
        ],
        None,
    ),
    (
        DALLAS + "\n" + ORLANDO,
        [
            ("get_current_weather", {"city": "Dallas", "state": "TX", "unit": "fahrenheit"}),
            ("get_current_weather", {"city": "Orlando", "state": "FL", "unit": "fahrenheit"}),
        ],
        None,
    ),
    (
        "Let me calculate that area for you."
        + _xml(
            "calculate_area",
            [("shape", "circle"), ("dimensions", '{"radius": 15.5}'), ("precision", "3")],
        ),
        [("calculate_area", {"shape": "circle", "dimensions": {"radius": 15.5}, "precision": 3})],
        "Let me calculate that area for you.",
    ),
]


@pytest.fixture
def qwen3(tokenizer):
    return _parser("qwen3_xml", tokenizer, SAMPLE_TOOLS)


def _parsed(calls) -> list[tuple[str, Any]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in calls]


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("output, expected, content", QWEN3_CASES)
def test_qwen3_extract_tool_calls(tokenizer, streaming, output, expected, content):
    got_content, calls = run_extraction(
        _parser("qwen3_xml", tokenizer, SAMPLE_TOOLS), output, streaming
    )
    assert _parsed(calls) == expected and got_content == content


def test_qwen3_fallback_and_malformed(qwen3, tokenizer):
    no_tags = (
        "<function=get_current_weather>\n<parameter=city>\nDallas\n</parameter>\n"
        "<parameter=state>\nTX\n</parameter>\n</function>"
    )
    assert _parsed(qwen3.extract_tool_calls(no_tags).tool_calls) == [
        ("get_current_weather", {"city": "Dallas", "state": "TX"})
    ]
    missing_close = (
        "Let me check the weather for you:\n<tool_call>\n<function="
        "get_current_weather>\n<parameter=city>\nDallas\n<parameter=state>\nTX\n"
        "</parameter>\n<parameter=unit>\nfahrenheit\n</parameter>\n</function>\n"
        "</tool_call>"
    )
    weather = ("get_current_weather", {"city": "Dallas", "state": "TX", "unit": "fahrenheit"})
    for streaming in (False, True):
        content, calls = run_extraction(
            _parser("qwen3_xml", tokenizer, SAMPLE_TOOLS), missing_close, streaming
        )
        assert _parsed(calls) == [weather]
        assert "Let me check the weather for you:" in content
    opening = missing_close.replace("<tool_call>\n", "\n")
    content, calls = run_extraction(_parser("qwen3_xml", tokenizer, SAMPLE_TOOLS), opening, True)
    assert _parsed(calls) == [weather] and "Let me check the weather" in content
    no_gt = (
        "<tool_call>\n<function=get_current_weather\n<parameter=city>Dallas</parameter>\n"
        "</function>\n</tool_call>"
    )
    assert all(c is not None for c in qwen3.extract_tool_calls(no_gt).tool_calls)
    bad_then_good = (
        "<tool_call>\n<function=bad_func_no_gt\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=get_current_weather>\n<parameter=city>Dallas"
        "</parameter>\n<parameter=state>TX</parameter>\n</function>\n</tool_call>"
    )
    result = _parser("qwen3_xml", tokenizer, SAMPLE_TOOLS).extract_tool_calls(bad_then_good)
    assert result.tools_called
    assert [a for n, a in _parsed(result.tool_calls) if n == "get_current_weather"] == [
        {"city": "Dallas", "state": "TX"}
    ]


TYPES_TOOL = [
    {
        "type": "function",
        "function": {
            "name": "test_types",
            "parameters": {
                "type": "object",
                "properties": {
                    "int_param": {"type": "integer"},
                    "float_param": {"type": "float"},
                    "bool_param": {"type": "boolean"},
                    "str_param": {"type": "string"},
                    "obj_param": {"type": "object"},
                    "anyof_int": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": 5},
                    "anyof_array": {
                        "anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}]
                    },
                    "type_as_array": {"type": ["integer", "null"]},
                    "multi_non_null": {
                        "anyOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]
                    },
                },
            },
        },
    }
]
TYPES_OUTPUT = _xml(
    "test_types",
    [
        ("int_param", "42"),
        ("float_param", "3.14"),
        ("bool_param", "true"),
        ("str_param", "hello world"),
        ("obj_param", '{"key": "value"}'),
        ("anyof_int", "5"),
        ("anyof_array", '["a", "b", "c"]'),
        ("type_as_array", "42"),
        ("multi_non_null", "some text"),
    ],
)
TYPES_EXPECTED = {
    "int_param": 42,
    "float_param": 3.14,
    "bool_param": True,
    "str_param": "hello world",
    "obj_param": {"key": "value"},
    "anyof_int": 5,
    "anyof_array": ["a", "b", "c"],
    "type_as_array": 42,
    "multi_non_null": "some text",
}


@pytest.mark.parametrize("streaming", [False, True])
def test_qwen3_type_conversion(tokenizer, streaming):
    _, calls = run_extraction(_parser("qwen3_xml", tokenizer, TYPES_TOOL), TYPES_OUTPUT, streaming)
    args = json.loads(calls[0].function.arguments)
    assert args == TYPES_EXPECTED
    assert all(type(args[k]) is type(v) for k, v in TYPES_EXPECTED.items())


def test_qwen3_not_double_encoded(tokenizer):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "update_record",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "data": {"anyOf": [{"type": "object"}, {"type": "null"}]},
                        "message": {"type": "string"},
                    },
                },
            },
        }
    ]
    output = (
        '<tool_call>\n<function=update_record>\n<parameter=data>{"key": "value", '
        '"count": 42}</parameter>\n<parameter=message>hello world</parameter>\n'
        "</function>\n</tool_call>"
    )
    raw = _parser("qwen3_xml", tokenizer, tools).extract_tool_calls(output).tool_calls[0]
    assert json.loads(raw.function.arguments) == {
        "data": {"key": "value", "count": 42},
        "message": "hello world",
    }
    assert '\\"hello world\\"' not in raw.function.arguments


def test_qwen3_streaming_is_incremental(qwen3):
    output = (
        "I'll check the weather.<tool_call>\n<function=get_current_weather>\n"
        "<parameter=city>\nDallas\n</parameter>\n<parameter=state>\nTX\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    chunks = []
    previous = ""
    for delta, ids in token_deltas(qwen3.model_tokenizer, output):
        message = qwen3.extract_tool_calls_streaming(previous, previous + delta, delta, [], [], ids)
        previous += delta
        if message:
            chunks.append(message)
    assert chunks[0].content and not chunks[0].tool_calls
    headers = [c.tool_calls[0] for c in chunks if c.tool_calls and c.tool_calls[0].id]
    assert headers[0].function.name == "get_current_weather" and headers[0].type == "function"
    args = [
        c.tool_calls[0].function.arguments
        for c in chunks
        if c.tool_calls and c.tool_calls[0].function.arguments
    ]
    assert len(args) > 3  # the string values streamed as they came
    assert json.loads("".join(args)) == {"city": "Dallas", "state": "TX"}


@pytest.mark.parametrize(
    "deltas",
    [
        [
            "<tool_call>",
            "\n<function=get_current_weather>",
            "\n",
            "<parameter=city>\nDallas\n</parameter>\n<parameter=state>\nTX\n</parameter>"
            "\n<parameter=unit>\nfahrenheit\n</parameter>",
            "\n</function>",
            "\n</tool_call>",
        ],
        [
            "<tool_call>\n<function=get_current_weather>\n<parameter=city>\nDallas\n</parameter>\n"
            "<parameter=state>\nTX\n</parameter>\n<parameter=unit>\nfahrenheit\n</parameter>\n"
            "</function>\n</tool_call>"
        ],
    ],
    ids=["multi_param_single_chunk", "complete_call_single_delta"],
)
def test_qwen3_streaming_big_deltas(qwen3, deltas):
    rec = run_streaming(qwen3, deltas, one_tool=False)
    assert _parsed(rec.tool_calls) == [
        ("get_current_weather", {"city": "Dallas", "state": "TX", "unit": "fahrenheit"})
    ]


def test_qwen3_next_tool_call_starts_in_close_delta(qwen3):
    deltas = [
        "<tool_call>\n",
        "<function=get_current_weather>\n",
        "<parameter=city>\nDallas\n</parameter>\n",
        "<parameter=state>\nTX\n</parameter>\n",
        "</function>",
        "\n</tool_call>\n<tool_call>\n<function=get_current_weather>\n"
        "<parameter=city>\nOrlando\n</parameter>\n<parameter=state>\nFL\n</parameter>\n"
        "</function>\n</tool_call>",
    ]
    rec = run_streaming(qwen3, deltas, one_tool=False)
    assert [a for _, a in _parsed(rec.tool_calls)] == [
        {"city": "Dallas", "state": "TX"},
        {"city": "Orlando", "state": "FL"},
    ]


@pytest.mark.parametrize("streaming", [False, True])
def test_qwen3_parameter_whitespace_preserved(tokenizer, streaming):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "write_file",
                "parameters": {"type": "object", "properties": {"content": {"type": "string"}}},
            },
        }
    ]
    output = (
        "<tool_call>\n<function=write_file>\n<parameter=content>\n"
        "    def foo():\n        return 1\n\n</parameter>\n</function>\n</tool_call>"
    )
    _, calls = run_extraction(_parser("qwen3_xml", tokenizer, tools), output, streaming)
    assert (
        json.loads(calls[0].function.arguments)["content"] == "    def foo():\n        return 1\n"
    )
