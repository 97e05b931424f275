"""/v1/responses through examples/server with the official `openai` client, unchanged.

Checks: a plain response and its usage; instructions; the streamed event sequence as the
SDK's own stream helper (client.responses.stream) accumulates it; a function tool (forced by
tool_choice "required"), streamed function_call_arguments events, and the tool result sent
back as function_call / function_call_output items; max_output_tokens -> status
"incomplete"; text.format json_schema; the store (VLLM_ENABLE_RESPONSES_API_STORE): GET of a
stored response, cancel of a complete one refused, previous_response_id continuing the
conversation, store=false not kept, and its LRU cap held under a burst; vLLM's errors; a
small fuzz (4xx in OpenAI's shape, never a 5xx). Oracle for generated text: the same
conversation as a greedy /v1/chat/completions request on the same server (the Responses API
is served through the chat path). Ports tests/entrypoints/openai/responses/test_basic.py
(test_simple_input, test_instructions, test_streaming), test_stateful.py (test_store,
test_cancel_completed, test_previous_response_id, test_background_error),
test_function_call.py (test_function_tool_use, test_function_calling_with_streaming_types),
test_simple.py (test_max_tokens), test_structured_output.py (test_structured_output) and
the event pairing of test_streaming_events.py.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

import pytest
from agent_server import (
    KEY,
    LOGS,
    MODEL,
    STORE_MAX_ENTRIES,
    WEATHER_PARAMETERS,
    post,
    server_fixture,
    sse_frames,
)
from hostile_server import no_traceback

from libvllm.engine.entrypoints.openai.responses.serving import output_items
from libvllm.engine.entrypoints.openai.responses.store import ResponseStore
from libvllm.engine.entrypoints.openai.responses.stream import ResponseEvents

openai = pytest.importorskip("openai")

WEATHER = {"type": "function", "name": "get_weather", "strict": True,
           "description": "The current weather in a city", "parameters": WEATHER_PARAMETERS}
QUESTION = "What is the capital of France?"
AUTH = {"Authorization": f"Bearer {KEY}"}


# ---- no server: the store's caps and the event state machine -----------------------------

def test_store_lru_caps_entries_and_bytes():
    store = ResponseStore(True, max_entries=3, max_bytes=10_000)
    for i in range(5):
        store.put({"id": f"r{i}", "output": []}, [{"role": "user", "content": "x"}])
    assert [store.get(f"r{i}") is not None for i in range(5)] == [False, False, True, True, True]
    store.get("r2")  # r2 becomes the most recently used: r3 goes next
    store.put({"id": "r5", "output": []}, [])
    assert store.get("r3") is None and store.get("r2") is not None
    small = ResponseStore(True, max_entries=100, max_bytes=200)
    for i in range(20):
        small.put({"id": f"s{i}", "output": ["y" * 40]}, [])
        assert small.stats()[1] <= 200
    assert small.get("s19") is not None and small.get("s0") is None
    small.put({"id": "big", "output": ["z" * 500]}, [])  # larger than the cap: not kept
    assert small.get("big") is None and small.stats()[1] <= 200
    with pytest.raises(ValueError):
        ResponseStore(True, max_entries=0)


def test_events_reasoning_then_text_then_tool_calls():
    """vLLM's SimpleStreamingEventProcessor order on a reasoning parser's and a tool
    parser's deltas: each kind closes the item before it; two calls are two items."""
    ev = ResponseEvents()
    out = ev.feed({"reasoning": "Let me"}, None) + ev.feed({"reasoning": " think."}, None)
    out += ev.feed({"reasoning": None, "content": "Hi"}, [{"token": "Hi", "logprob": -0.5}])
    out += ev.feed({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                                    "function": {"name": "f", "arguments": "{\"a\""}}]}, None)
    out += ev.feed({"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}, None)
    out += ev.feed({"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                                    "function": {"name": "g", "arguments": "{}"}}]}, None)
    out += ev.close("incomplete")
    assert [e["type"] for e in out] == [
        "response.output_item.added", "response.content_part.added",
        "response.reasoning_text.delta", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done"]
    items = ev.output_items
    assert [i["type"] for i in items] == ["reasoning", "message", "function_call",
                                          "function_call"]
    assert items[0]["content"][0]["text"] == "Let me think."
    assert items[1]["content"][0]["logprobs"] == [{"token": "Hi", "logprob": -0.5}]
    assert (items[2]["call_id"], items[2]["arguments"], items[2]["status"]) == \
        ("call_a", '{"a": 1}', "completed")
    assert (items[3]["name"], items[3]["status"]) == ("g", "incomplete")
    assert [e["output_index"] for e in out if e["type"].endswith("item.done")] == [0, 1, 2, 3]


def test_output_items_reasoning_message_calls():
    """vLLM's build_response_output_items: reasoning, message, then one item per call; only
    the last item takes the finish reason's status."""
    items = output_items({"reasoning": "Hmm", "content": "Sure.", "tool_calls": [
        {"id": "c1", "function": {"name": "f", "arguments": "{}"}},
        {"id": "c2", "function": {"name": "g", "arguments": "{\"a\": 1"}}]},
        {"content": [{"token": "Sure", "logprob": -1.0}]}, "length")
    assert [i["type"] for i in items] == ["reasoning", "message", "function_call",
                                          "function_call"]
    assert items[0]["content"] == [{"text": "Hmm", "type": "reasoning_text"}]
    assert items[1]["status"] == "completed"
    assert items[1]["content"][0]["logprobs"] == [{"token": "Sure", "logprob": -1.0}]
    assert [(i["call_id"], i["status"]) for i in items[2:]] == [("c1", "completed"),
                                                                 ("c2", "incomplete")]
    assert output_items({"content": "Hi"}, None, "length")[0]["status"] == "incomplete"


# ---- through the server ---------------------------------------------------------------------

server = server_fixture("responses")


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server}/v1", api_key=KEY, max_retries=0,
                         timeout=120)


def chat_text(client, messages, max_tokens, **kw) -> str:
    """The oracle: the same conversation as a greedy chat completion."""
    res = client.chat.completions.create(model=MODEL, messages=messages, temperature=0,
                                         max_tokens=max_tokens, **kw)
    return res.choices[0].message.content


def test_simple_input(client):
    res = client.responses.create(model=MODEL, input=QUESTION, temperature=0,
                                  max_output_tokens=24, store=False)
    assert res.object == "response" and res.status in ("completed", "incomplete")
    assert [item.type for item in res.output] == ["message"]
    assert res.output_text == chat_text(client, [{"role": "user", "content": QUESTION}], 24)
    u = res.usage
    assert u.input_tokens > 0 and 0 < u.output_tokens <= 24
    assert u.total_tokens == u.input_tokens + u.output_tokens
    assert res.max_output_tokens == 24 and res.temperature == 0


def test_instructions_and_message_items(client):
    system = "Answer in French."
    res = client.responses.create(
        model=MODEL, instructions=system, temperature=0, max_output_tokens=16, store=False,
        input=[{"type": "message", "role": "user",
                "content": [{"type": "input_text", "text": QUESTION}]}])
    assert res.instructions == system
    assert res.output_text == chat_text(client, [{"role": "system", "content": system},
                                                 {"role": "user", "content": QUESTION}], 16)


def test_streamed_events_through_the_sdk_helper(client):
    """client.responses.stream checks the event order as it accumulates the snapshot."""
    with client.responses.stream(model=MODEL, input=QUESTION, temperature=0,
                                 max_output_tokens=16, store=False) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert types[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", f"response.{final.status}"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text == chat_text(
        client, [{"role": "user", "content": QUESTION}], 16)
    assert final.usage.output_tokens > 0


def test_output_text_logprobs(client):
    res = client.responses.create(model=MODEL, input=QUESTION, temperature=0,
                                  max_output_tokens=6, store=False, top_logprobs=2,
                                  include=["message.output_text.logprobs"])
    logprobs = res.output[0].content[0].logprobs
    assert len(logprobs) == res.usage.output_tokens and res.top_logprobs == 2
    assert "".join(lp.token for lp in logprobs) == res.output_text
    for lp in logprobs:  # greedy: the sampled token is the most likely one
        assert len(lp.top_logprobs) == 2 and lp.logprob == lp.top_logprobs[0].logprob


def test_raw_stream_frames_name_their_event(server):
    frames = sse_frames(server, "/v1/responses", {"model": MODEL, "input": "Hi",
                                                  "max_output_tokens": 3, "stream": True},
                        AUTH)
    named = [(name, json.loads(data)) for name, data in frames]  # no [DONE], as vLLM
    assert named and all(name == data["type"] for name, data in named)


def test_function_tool_round_trip(client):
    question = "What is the weather in Paris?"
    first = client.responses.create(model=MODEL, input=question, tools=[WEATHER],
                                    tool_choice="required", temperature=0,
                                    max_output_tokens=120, store=False)
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and set(json.loads(call.arguments)) == {"city"}
    assert call.call_id and call.status == "completed"
    items = [{"type": "message", "role": "user", "content": question},
             {"type": "function_call", "call_id": call.call_id, "name": call.name,
              "arguments": call.arguments},
             {"type": "function_call_output", "call_id": call.call_id,
              "output": '{"temp_c": 21}'}]
    second = client.responses.create(model=MODEL, input=items, tools=[WEATHER],
                                     tool_choice="none", temperature=0, max_output_tokens=16,
                                     store=False)
    chat_tool = {"type": "function", "function": {k: v for k, v in WEATHER.items()
                                                  if k != "type"}}
    expected = chat_text(client, [
        {"role": "user", "content": question},
        {"role": "assistant", "tool_calls": [{"id": call.call_id, "type": "function",
                                              "function": {"name": call.name,
                                                           "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": '{"temp_c": 21}'}], 16,
        tools=[chat_tool], tool_choice="none")
    assert second.output_text == expected


def test_function_tool_streamed(client):
    with client.responses.stream(model=MODEL, input="What is the weather in Paris?",
                                 tools=[WEATHER], tool_choice="required", temperature=0,
                                 max_output_tokens=120, store=False) as stream:
        events = list(stream)
        final = stream.get_final_response()
    args = "".join(e.delta for e in events
                   if e.type == "response.function_call_arguments.delta")
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    (call,) = [item for item in final.output if item.type == "function_call"]
    assert done.arguments == args == call.arguments and done.name == "get_weather"
    assert set(json.loads(args)) == {"city"}


def test_max_output_tokens_incomplete(client):
    res = client.responses.create(model=MODEL, input="Write a long story about a cat.",
                                  temperature=0, max_output_tokens=2, store=False)
    assert res.status == "incomplete" and res.incomplete_details.reason == "max_output_tokens"
    assert res.usage.output_tokens == 2 and res.output[0].status == "incomplete"


def test_text_format_json_schema(client):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
              "required": ["city"], "additionalProperties": False}
    res = client.responses.create(
        model=MODEL, input="Name a city as JSON.", temperature=0, max_output_tokens=40,
        store=False, text={"format": {"type": "json_schema", "name": "city", "schema": schema,
                                      "strict": True}})
    assert set(json.loads(res.output_text)) == {"city"}


def test_store_get_cancel_and_previous_response_id(client):
    first = client.responses.create(model=MODEL, input="My name is Mark.", temperature=0,
                                    max_output_tokens=12)
    got = client.responses.retrieve(first.id)
    assert (got.id, got.status, got.output_text) == (first.id, first.status, first.output_text)
    with pytest.raises(openai.BadRequestError, match="Cannot cancel a synchronous response."):
        client.responses.cancel(first.id)
    second = client.responses.create(model=MODEL, input="What is my name?", temperature=0,
                                     max_output_tokens=12, previous_response_id=first.id)
    assert second.previous_response_id == first.id
    assert second.output_text == chat_text(client, [
        {"role": "user", "content": "My name is Mark."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What is my name?"}], 12)
    unstored = client.responses.create(model=MODEL, input="Hi", max_output_tokens=2,
                                       store=False)
    for missing in (unstored.id, "resp_missing"):
        with pytest.raises(openai.NotFoundError, match="Response with id .* not found."):
            client.responses.retrieve(missing)
    with pytest.raises(openai.NotFoundError, match="Response with id .* not found."):
        client.responses.create(model=MODEL, input="Hi", previous_response_id="resp_missing")


def test_store_stays_within_its_cap_under_a_burst(client):
    def one(i):
        return client.responses.create(model=MODEL, input=f"Count to {i}.",
                                       max_output_tokens=2).id

    with ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(one, range(3 * STORE_MAX_ENTRIES)))
    kept = 0
    for rid in ids:
        try:
            client.responses.retrieve(rid)
            kept += 1
        except openai.NotFoundError:
            pass
    assert kept == STORE_MAX_ENTRIES


@pytest.mark.parametrize(("body", "status", "message"), [
    ({"input": "Hi", "background": True, "store": False}, 400,
     "background can only be used when `store` is true"),
    ({"input": "Hi", "prompt": {"id": "p"}}, 400, "prompt template is not supported"),
    ({"input": [{"type": "image_generation_call", "id": "x"}]}, 400,
     "Unsupported input item type: image_generation_call"),
    ({"input": "Hi", "model": "other"}, 404, "The model `other` does not exist."),
    ({"input": "Hi", "max_output_tokens": 100000}, 400,
     "max_output_tokens=100000 cannot be greater than max_model_len=512."),
    ({"input": "Hi", "tools": [{"type": "web_search_preview"}]}, 400, "is not supported"),
    ({"input": "Hi", "previous_input_messages": [{"role": "user", "content": "a"}],
      "previous_response_id": "resp_x"}, 400,
     "Only one of `previous_input_messages` and `previous_response_id` can be set."),
    ({}, 400, "Field required"),
])
def test_errors_have_openai_shape(server, body, status, message):
    code, text = post(server, "/v1/responses", body, AUTH)
    error = json.loads(text)["error"]
    assert code == status == error["code"] and message in error["message"]
    assert set(error) == {"message", "type", "param", "code"}


def test_unknown_paths_and_methods(server):
    assert post(server, "/v1/responses/x/y", {}, AUTH)[0] == 404
    assert post(server, "/v1/responses/x", {}, AUTH)[0] == 405


hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_junk = st.recursive(st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats()
                     | st.text(max_size=8), lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)
_item = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "x"]),
                           "content": st.one_of(st.text(max_size=20), _junk)}),
    st.fixed_dictionaries({"type": st.sampled_from(["function_call", "function_call_output",
                                                    "reasoning", "message", "other"])},
                          optional={"call_id": _junk, "name": _junk, "arguments": _junk,
                                    "output": _junk, "content": _junk}), _junk)
_body = st.fixed_dictionaries({}, optional={
    "input": st.one_of(st.text(max_size=20), st.lists(_item, max_size=3), _junk),
    "max_output_tokens": st.one_of(st.integers(-2, 3), _junk), "stream": st.booleans(),
    "temperature": st.one_of(st.floats(-1, 3), _junk), "top_p": _junk, "store": _junk,
    "tools": st.one_of(st.just([WEATHER]), _junk), "tool_choice": _junk, "text": _junk,
    "reasoning": _junk, "include": _junk, "instructions": _junk, "truncation": _junk,
    "previous_response_id": _junk, "background": _junk})


@settings(max_examples=int(os.environ.get("VLLM_FUZZ_EXAMPLES", "25")), deadline=None,
          derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(body=_body)
def test_fuzz_never_5xx(server, body):
    try:
        data = json.dumps(body)
    except (ValueError, TypeError):
        return
    body = json.loads(data)
    # the fuzz is about validation: a valid body without a limit would generate up to
    # max_model_len tokens, minutes on a loaded 2-core machine (the client's timeout)
    body.setdefault("max_output_tokens", 8)
    status, text = post(server, "/v1/responses", body, AUTH)
    assert 200 <= status < 500, (status, data[:300], text[:300])
    if status != 200:
        error = json.loads(text)["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
    assert "event: error" not in text, text[-500:]
    no_traceback(LOGS[server])
