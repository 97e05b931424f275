"""/v1/messages and /v1/messages/count_tokens through examples/server with the official
`anthropic` client, unchanged (it authenticates with x-api-key).

Checks: a plain message, a system prompt (string and blocks), stop_sequences; the streamed
events as the SDK's own stream helper (client.messages.stream) accumulates them, and their
SSE `event:` lines; a tool round trip (tool_choice tool, then the tool_result back) and a
streamed tool call (tool_choice any: input_json_delta); output_config json_schema;
count_tokens; Anthropic's error body with the right 4xx; a small fuzz (never a 5xx).
No server: translate_error_type, the request conversion and the stream converter on a
reasoning parser's and a tool parser's chunks. Oracle for generated text and token counts:
the same conversation as a greedy /v1/chat/completions request and /tokenize on the same
server (the Messages API is served through the chat path).
Ports tests/entrypoints/anthropic/test_messages.py (test_simple_messages,
test_system_message, test_anthropic_streaming, test_anthropic_tool_call,
test_anthropic_tool_call_streaming, test_anthropic_structured_output),
test_error_type_mapping.py and cases of test_anthropic_messages_conversion.py
(tool_result content, billing header, thinking blocks).
"""

from __future__ import annotations

import json
import os

import pytest
from agent_server import KEY, LOGS, MODEL, WEATHER_PARAMETERS, post, server_fixture, sse_frames
from hostile_server import no_traceback

from libvllm.engine.entrypoints.anthropic.protocol import MessagesRequest, translate_error_type
from libvllm.engine.entrypoints.anthropic.serving import content_blocks, to_chat_request
from libvllm.engine.entrypoints.anthropic.stream import stream_events

anthropic = pytest.importorskip("anthropic")

WEATHER = {"name": "get_weather", "description": "The current weather in a city",
           "input_schema": WEATHER_PARAMETERS, "strict": True}
QUESTION = "What is the capital of France?"
HEADERS = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
GREEDY = {"temperature": 0}  # this SDK's create() no longer takes sampling arguments


# ---- no server ----------------------------------------------------------------------------

@pytest.mark.parametrize(("status", "expected"), [
    (400, "invalid_request_error"), (401, "authentication_error"), (403, "permission_error"),
    (404, "not_found_error"), (413, "request_too_large"), (418, "invalid_request_error"),
    (422, "invalid_request_error"), (429, "rate_limit_error"), (500, "api_error"),
    (501, "api_error"), (503, "overloaded_error")])
def test_error_type_mapping(status, expected):
    assert translate_error_type(status) == expected


def test_request_conversion():
    req = MessagesRequest.model_validate({
        "model": MODEL, "max_tokens": 2048, "stop_sequences": ["END"],
        "system": [{"type": "text", "text": "x-anthropic-billing-header: abc"},
                   {"type": "text", "text": "Be brief."}],
        "tools": [{"name": "f", "input_schema": {"properties": {}}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "a", "signature": "s"},
                {"type": "thinking", "thinking": "b", "signature": "s"},
                {"type": "text", "text": "Calling."},
                {"type": "tool_use", "id": "t1", "name": "f", "input": {"k": 1}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1",
                 "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]},
                {"type": "text", "text": "Thanks"}]}]})
    chat = to_chat_request(req)
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Calling.", "reasoning": "ab",
         "tool_calls": [{"id": "t1", "type": "function",
                         "function": {"name": "f", "arguments": '{"k": 1}'}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "one\ntwo"},
        {"role": "user", "content": "Thanks"}]
    assert (chat["tool_choice"], chat["parallel_tool_calls"], chat["stop"]) == \
        ("required", False, ["END"])
    assert chat["tools"][0]["function"]["parameters"] == {"properties": {}, "type": "object"}
    assert chat["thinking_token_budget"] == 1024 and chat["max_tokens"] == 2048


def test_full_message_blocks():
    """messages_full_converter: thinking, text, tool_use; an empty answer: one text block."""
    blocks = content_blocks({"reasoning": "Hmm", "content": "Sure.", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]})
    assert [b["type"] for b in blocks] == ["thinking", "text", "tool_use"]
    assert blocks[0]["thinking"] == "Hmm" and blocks[0]["signature"]
    assert blocks[2] == {"type": "tool_use", "id": "c1", "name": "f", "input": {"a": 1}}
    assert content_blocks({"content": None}) == [{"type": "text", "text": ""}]


def _chunk(delta=None, finish=None, usage=None, choices=True):
    body = {"id": "chatcmpl-1", "model": MODEL, "choices": [
        {"index": 0, "delta": delta or {}, "finish_reason": finish}] if choices else []}
    if usage:
        body["usage"] = usage
    return json.dumps(body)


def test_stream_converter_thinking_text_tool():
    """vLLM's message_stream_converter on reasoning, text, then a tool call."""
    usage = {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}
    chunks = [_chunk({"role": "assistant", "content": ""}, usage=usage),
              _chunk({"reasoning": "Hmm"}), _chunk({"content": "Sure."}),
              _chunk({"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                                      "function": {"name": "f", "arguments": ""}}]}),
              _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a": 1}'}}]}),
              _chunk({"content": "late"}, finish="tool_calls"),
              _chunk(usage=usage, choices=False)]
    events = [json.loads(e) for e in stream_events(iter(chunks))]
    shape = [(e["type"], e.get("index"), (e.get("delta") or {}).get("type")) for e in events]
    assert shape == [
        ("message_start", None, None),
        ("content_block_start", 0, None), ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "signature_delta"), ("content_block_stop", 0, None),
        ("content_block_start", 1, None), ("content_block_delta", 1, "text_delta"),
        ("content_block_stop", 1, None),
        ("content_block_start", 2, None), ("content_block_delta", 2, "input_json_delta"),
        ("content_block_stop", 2, None),
        ("content_block_start", 3, None), ("content_block_delta", 3, "text_delta"),
        ("content_block_stop", 3, None),
        ("message_delta", None, None), ("message_stop", None, None)]
    assert events[0]["message"]["usage"] == {"input_tokens": 7, "output_tokens": 5}
    assert events[8]["content_block"] == {"type": "tool_use", "id": "c1", "name": "f",
                                          "input": {}}
    assert events[-2]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}


def test_stream_converter_error_event():
    def failing():
        yield _chunk({"role": "assistant", "content": ""})
        yield _chunk({"content": "a"})
        raise ValueError("boom")

    events = [json.loads(e) for e in stream_events(failing())]
    assert [e["type"] for e in events][-2:] == ["content_block_stop", "error"]
    assert events[-1]["error"] == {"type": "invalid_request_error", "message": "boom"}


# ---- through the server ---------------------------------------------------------------------

server = server_fixture("messages")


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=f"http://127.0.0.1:{server}", api_key=KEY,
                               max_retries=0, timeout=120)


def chat(server, messages, max_tokens, **kw) -> dict:
    """The oracle: the same conversation as a greedy chat completion."""
    status, text = post(server, "/v1/chat/completions",
                        {"model": MODEL, "messages": messages, "temperature": 0,
                         "max_tokens": max_tokens, **kw}, {"Authorization": f"Bearer {KEY}"})
    assert status == 200, text
    return json.loads(text)


def test_simple_message(server, client):
    res = client.messages.create(model=MODEL, max_tokens=24, extra_body=GREEDY,
                                 messages=[{"role": "user", "content": QUESTION}])
    oracle = chat(server, [{"role": "user", "content": QUESTION}], 24)
    assert res.type == "message" and res.role == "assistant" and res.model == MODEL
    assert [b.type for b in res.content] == ["text"]
    assert res.content[0].text == oracle["choices"][0]["message"]["content"]
    assert res.stop_reason == {"stop": "end_turn", "length": "max_tokens"}[
        oracle["choices"][0]["finish_reason"]]
    assert (res.usage.input_tokens, res.usage.output_tokens) == \
        (oracle["usage"]["prompt_tokens"], oracle["usage"]["completion_tokens"])


@pytest.mark.parametrize("system", ["Answer in French.",
                                    [{"type": "text", "text": "Answer in French."}]])
def test_system_prompt(server, client, system):
    res = client.messages.create(model=MODEL, max_tokens=16, extra_body=GREEDY, system=system,
                                 messages=[{"role": "user", "content": QUESTION}])
    oracle = chat(server, [{"role": "system", "content": "Answer in French."},
                           {"role": "user", "content": QUESTION}], 16)
    assert res.content[0].text == oracle["choices"][0]["message"]["content"]


def test_stop_sequences(client):
    full = client.messages.create(model=MODEL, max_tokens=24, extra_body=GREEDY,
                                  messages=[{"role": "user", "content": QUESTION}])
    words = full.content[0].text.split()
    assert len(words) > 3, full.content[0].text
    stop = words[3]
    res = client.messages.create(model=MODEL, max_tokens=24, extra_body=GREEDY,
                                 stop_sequences=[stop],
                                 messages=[{"role": "user", "content": QUESTION}])
    assert (res.stop_reason, res.stop_sequence) == ("stop_sequence", stop)
    text = full.content[0].text
    assert res.content[0].text == text[:text.index(stop)]


def test_streamed_through_the_sdk_helper(client, server):
    messages = [{"role": "user", "content": QUESTION}]
    with client.messages.stream(model=MODEL, max_tokens=16, extra_body=GREEDY,
                                messages=messages) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    plain = client.messages.create(model=MODEL, max_tokens=16, extra_body=GREEDY,
                                   messages=messages)
    assert text == final.content[0].text == plain.content[0].text
    assert final.stop_reason == plain.stop_reason and final.usage.output_tokens > 0
    frames = sse_frames(server, "/v1/messages", {"model": MODEL, "max_tokens": 3,
                                                 "stream": True, "messages": messages},
                        HEADERS)
    events = [(name, json.loads(data)) for name, data in frames]  # no [DONE], as vLLM
    assert all(name == data["type"] for name, data in events)
    assert events[0][1]["message"]["usage"]["output_tokens"] == 0
    assert events[0][1]["message"]["usage"]["input_tokens"] > 5
    assert [name for name, _ in events][-2:] == ["message_delta", "message_stop"]


def test_tool_round_trip(server, client):
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.messages.create(model=MODEL, max_tokens=120, extra_body=GREEDY,
                                   tools=[WEATHER], messages=question,
                                   tool_choice={"type": "tool", "name": "get_weather"})
    (use,) = [b for b in first.content if b.type == "tool_use"]
    assert first.stop_reason == "tool_use" and use.name == "get_weather"
    assert set(use.input) == {"city"}
    turn = question + [{"role": "assistant", "content": [b.model_dump() for b in first.content]},
                       {"role": "user", "content": [{"type": "tool_result",
                                                     "tool_use_id": use.id,
                                                     "content": '{"temp_c": 21}'}]}]
    second = client.messages.create(model=MODEL, max_tokens=16, extra_body=GREEDY,
                                    tools=[WEATHER], tool_choice={"type": "none"},
                                    messages=turn)
    chat_tool = {"type": "function", "function": {
        "name": "get_weather", "description": WEATHER["description"],
        "parameters": WEATHER_PARAMETERS, "strict": True}}
    oracle = chat(server, question + [
        {"role": "assistant", "tool_calls": [{"id": use.id, "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps(use.input)}}]},
        {"role": "tool", "tool_call_id": use.id, "content": '{"temp_c": 21}'}], 16,
        tools=[chat_tool], tool_choice="none", parallel_tool_calls=True)
    assert second.content[0].text == oracle["choices"][0]["message"]["content"]
    assert second.stop_reason in ("end_turn", "max_tokens")


def test_tool_call_streamed(client):
    with client.messages.stream(model=MODEL, max_tokens=120, extra_body=GREEDY, tools=[WEATHER],
                                tool_choice={"type": "any"},
                                messages=[{"role": "user",
                                           "content": "What is the weather in Paris?"}]) as s:
        events = list(s)
        final = s.get_final_message()
    partial = "".join(e.delta.partial_json for e in events if e.type == "content_block_delta"
                      and e.delta.type == "input_json_delta")
    (use,) = [b for b in final.content if b.type == "tool_use"]
    assert json.loads(partial) == use.input and set(use.input) == {"city"}
    assert final.stop_reason == "tool_use"


def test_output_config_json_schema(client):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
              "required": ["city"], "additionalProperties": False}
    res = client.messages.create(model=MODEL, max_tokens=40, extra_body=GREEDY,
                                 messages=[{"role": "user", "content": "Name a city."}],
                                 output_config={"format": {"type": "json_schema",
                                                           "schema": schema}})
    assert set(json.loads(res.content[0].text)) == {"city"}


def test_count_tokens(server, client):
    messages = [{"role": "user", "content": QUESTION}]
    counted = client.messages.count_tokens(model=MODEL, system="Be brief.", messages=messages)
    status, text = post(server, "/tokenize", {"model": MODEL, "messages": [
        {"role": "system", "content": "Be brief."}, *messages]},
        {"Authorization": f"Bearer {KEY}"})
    assert status == 200 and counted.input_tokens == json.loads(text)["count"]
    res = client.messages.create(model=MODEL, max_tokens=1, system="Be brief.",
                                 messages=messages)
    assert res.usage.input_tokens == counted.input_tokens


def test_api_key_is_required(server):
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=f"http://127.0.0.1:{server}", api_key="wrong",
                            max_retries=0).messages.create(
            model=MODEL, max_tokens=1, messages=[{"role": "user", "content": "Hi"}])


HI = [{"role": "user", "content": "Hi"}]


@pytest.mark.parametrize(("path", "body", "status", "message"), [
    ("/v1/messages", {"model": MODEL, "messages": HI}, 400, "Field required"),
    ("/v1/messages", {"model": MODEL, "max_tokens": 0, "messages": HI}, 400,
     "max_tokens must be positive"),
    ("/v1/messages", {"model": MODEL, "max_tokens": 5, "messages": HI,
                      "tools": [WEATHER], "tool_choice": {"type": "tool"}}, 400,
     "tool_choice.name is required when type is 'tool'"),
    ("/v1/messages", {"model": MODEL, "max_tokens": 1100, "messages": HI,
                      "thinking": {"type": "enabled", "budget_tokens": 2000}}, 400,
     "thinking.budget_tokens must be less than max_tokens"),
    ("/v1/messages", {"model": "claude-x", "max_tokens": 5, "messages": HI}, 404,
     "The model `claude-x` does not exist."),
    ("/v1/messages", {"model": MODEL, "max_tokens": 5, "messages": [
        {"role": "user", "content": [{"type": "image", "source": {"type": "url",
                                                                  "url": "http://x"}}]}]},
     400, "`image content blocks` is not supported yet by this server."),
    ("/v1/messages/count_tokens", {"messages": HI}, 400, "Field required"),
])
def test_errors_have_anthropic_shape(server, path, body, status, message):
    code, text = post(server, path, body, HEADERS)
    data = json.loads(text)
    assert code == status and set(data) == {"type", "error"} and data["type"] == "error"
    assert data["error"]["type"] == translate_error_type(status)
    assert message in data["error"]["message"]


hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_junk = st.recursive(st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats()
                     | st.text(max_size=8), lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)
_block = st.one_of(st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "tool_use", "tool_result", "thinking", "image", "x"])},
    optional={"text": _junk, "id": _junk, "name": _junk, "input": _junk, "content": _junk,
              "tool_use_id": _junk, "thinking": _junk}), _junk)
_message = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system"]),
                                  "content": st.one_of(st.text(max_size=20),
                                                       st.lists(_block, max_size=3))})
_body = st.fixed_dictionaries({"model": st.one_of(st.just(MODEL), _junk)}, optional={
    "messages": st.one_of(st.lists(_message, max_size=3), _junk),
    "max_tokens": st.one_of(st.integers(-2, 3), _junk), "stream": st.booleans(),
    "system": _junk, "temperature": st.one_of(st.floats(-1, 3), _junk), "top_k": _junk,
    "top_p": _junk, "stop_sequences": _junk, "tools": st.one_of(st.just([WEATHER]), _junk),
    "tool_choice": _junk, "thinking": _junk, "output_config": _junk})


@settings(max_examples=int(os.environ.get("VLLM_FUZZ_EXAMPLES", "25")), deadline=None,
          derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(body=_body, path=st.sampled_from(["/v1/messages", "/v1/messages/count_tokens"]))
def test_fuzz_never_5xx(server, body, path):
    try:
        data = json.dumps(body)
    except (ValueError, TypeError):
        return
    status, text = post(server, path, json.loads(data), HEADERS)
    assert 200 <= status < 500, (status, data[:300], text[:300])
    if status != 200:
        err = json.loads(text)
        assert err["type"] == "error" and err["error"]["type"] == translate_error_type(status)
    assert "event: error" not in text, text[-500:]
    no_traceback(LOGS[server])
