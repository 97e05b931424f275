"""Structured outputs and forced tool calls through the OpenAI layer, on the default model.

Ports cases of tests/entrypoints/openai/chat_completion/test_chat.py (vLLM 0.33:
test_structured_outputs_{choice,json,regex}_chat, _type_error, _choice_chat_logprobs,
test_response_format_{json_object,json_schema,text}) and the required / named tool_choice
behaviour of tests/entrypoints/openai/chat_completion/test_completion_with_function_calling.py
and test_message_assembly.py. The oracles are the constraints themselves: json.loads +
jsonschema for a schema (20 sampled choices, 10 streamed and 10 not), re.fullmatch, membership,
a Python regex equivalent to a llama.cpp-style GBNF grammar; and vLLM's messages.
Also: a malformed constraint is a 400 and the next request is served; a grammar that fails
after validation fails its request alone while another one in the same batch finishes.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest

from libvllm.engine.async_llm import AsyncLLM
from libvllm.engine.config import EngineConfig
from libvllm.engine.entrypoints.openai.api import handle_openai_request
from libvllm.engine.entrypoints.openai.chat_parser import check_tool_choice
from libvllm.engine.entrypoints.openai.chat_protocol import ChatCompletionRequest
from libvllm.engine.entrypoints.openai.errors import VLLMValidationError
from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.llm_engine import LLMEngine
from tests.test_structured_output import LLAMA_CPP_STYLE_JSON_GBNF
from tests.test_structured_output_model import ANSWER_GBNF, ANSWER_RE

pytestmark = pytest.mark.slow
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "skills": {"type": "array", "items": {"type": "string", "maxLength": 8},
                   "maxItems": 2},
    },
    "required": ["name", "age", "skills"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Describe a software engineer as JSON."}]
# strict: the hermes parser's structural tags (vLLM 0.33, VLLM_ENFORCE_STRICT_TOOL_CALLING on)
# pin a forced call's arguments to the tool's schema only for strict tools
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city", "strict": True,
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "get_time", "strict": True, "parameters": {"type": "object", "properties": {
            "zone": {"type": "string", "maxLength": 10}}, "required": ["zone"],
            "additionalProperties": False}}}]
WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(model_path):
    engine = LLMEngine.from_config(EngineConfig(
        model=model_path, device="cpu", max_model_len=1024, max_num_seqs=24,
        tool_call_parser="hermes", enable_auto_tool_choice=True))
    llm = AsyncLLM(engine)
    yield llm
    llm.shutdown()


def call(client, body, endpoint="/v1/chat/completions"):
    res = handle_openai_request(client, "POST", endpoint, json.dumps(body),
                                served_model_name="smol")
    if res.stream is None:
        return res.status, json.loads(res.body)
    chunks = []
    while (chunk := res.stream.get(120)) != "":
        assert chunk is not None, "no chunk within 120 s"
        chunks.append(json.loads(chunk))
    return res.status, chunks


def ok(client, body, endpoint="/v1/chat/completions"):
    status, out = call(client, body, endpoint)
    assert status == 200, out
    return out


def ok_together(client, *bodies, endpoint="/v1/chat/completions"):
    """ok() for each body, the requests in flight at once (one thread each): they share the
    engine's steps, so the batch costs its longest request instead of the sum."""
    with ThreadPoolExecutor(len(bodies)) as pool:
        futures = [pool.submit(ok, client, *(b if isinstance(b, tuple) else (b, endpoint)))
                   for b in bodies]
        return [f.result() for f in futures]


def streamed_choices(chunks) -> dict[int, dict]:
    """Per choice index: joined content, tool-call deltas by tool index, finish_reason."""
    choices: dict[int, dict] = {}
    for chunk in chunks:
        assert "error" not in chunk, chunk
        for c in chunk["choices"]:
            ch = choices.setdefault(c["index"], {"content": "", "calls": {}, "finish": None})
            ch["content"] += c["delta"].get("content") or ""
            for call_delta in c["delta"].get("tool_calls") or []:
                ch["calls"].setdefault(call_delta["index"], []).append(call_delta)
            ch["finish"] = c["finish_reason"] or ch["finish"]
    return choices


@pytest.fixture(scope="module")
def sampled_persons(client):
    """The two requests of the test below (streamed with seed 10, not with seed 0), in
    flight together: 20 choices in one batch, at the cost of the longest."""
    bodies = [{"messages": ASK, "n": 10, "seed": seed, "temperature": 1.0, "max_tokens": 200,
               "stream": stream, "response_format": {
                   "type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}}
              for stream, seed in ((False, 0), (True, 10))]
    full, streamed = ok_together(client, *bodies)
    return {False: full, True: streamed}


@pytest.mark.parametrize("stream", [False, True], ids=["full", "streamed"])
def test_json_schema_holds_on_20_sampled_runs(sampled_persons, stream):
    """10 choices a request, streamed and not, other seeds (choice i samples with seed + i):
    20 different sampled runs in all, each at the cost of its longest choice."""
    out = sampled_persons[stream]
    texts = [c["content"] for c in streamed_choices(out).values()] if stream else \
        [c["message"]["content"] for c in out["choices"]]
    assert len(texts) == 10
    for text in texts:
        jsonschema.validate(json.loads(text), PERSON)
    assert len(set(texts)) > 1  # sampled, not one greedy answer 10 times


def test_choice_regex_and_grammar_chat(client):
    choices = ["Python", "Java", "JavaScript", "C++", "C#", "PHP", "TypeScript", "Ruby"]
    msgs = [{"role": "user", "content": "The best language for type-safe systems is"}]
    ip = r"((25[0-5]|(2[0-4]|1\d|[1-9]|)\d)\.){3}(25[0-5]|(2[0-4]|1\d|[1-9]|)\d)"
    # llama.cpp's json.gbnf (guidance: xgrammar rejects its `ws ::= |`), strings capped
    bounded = LLAMA_CPP_STYLE_JSON_GBNF.replace(')* "\\"" ws', '){0,12} "\\"" ws')
    assert bounded != LLAMA_CPP_STYLE_JSON_GBNF
    first, ip_out, answer, json_out = ok_together(
        client,
        {"messages": msgs, "temperature": 0.7, "seed": 1, "max_tokens": 10,
         "structured_outputs": {"choice": choices}},
        {"messages": [{"role": "user", "content": "Give an example IP address"}],
         "max_tokens": 20, "seed": 2, "structured_outputs": {"regex": ip}},
        {"messages": [{"role": "user", "content": "Is the sky blue?"}],
         "max_tokens": 40, "seed": 3, "structured_outputs": {"grammar": ANSWER_GBNF}},
        {"messages": ASK, "max_tokens": 200, "temperature": 0,
         "structured_outputs": {"grammar": bounded}})
    assert first["choices"][0]["message"]["content"] in choices
    assert re.fullmatch(ip, ip_out["choices"][0]["message"]["content"])
    assert re.fullmatch(ANSWER_RE, answer["choices"][0]["message"]["content"])
    assert isinstance(json.loads(json_out["choices"][0]["message"]["content"]), dict)


def test_choice_logprobs_and_json_object_and_completions(client):
    tag = {"type": "structural_tag", "format": {"type": "sequence", "elements": [
        {"type": "const_string", "value": "Answer: "},
        {"type": "json_schema", "json_schema": {"type": "object", "properties": {
            "ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}}]}}
    out, obj, completion, tagged, text = ok_together(
        client,
        {"messages": ASK, "max_tokens": 10, "logprobs": True, "top_logprobs": 5,
         "structured_outputs": {"choice": ["yes", "no"]}},
        {"messages": [{"role": "user", "content": 'what is 1+1? respond with '
                       'a JSON object, the format is {"result": 2}'}],
         "max_tokens": 60, "temperature": 0, "response_format": {"type": "json_object"}},
        ({"prompt": "The colour of the sky is", "max_tokens": 5,
          "structured_outputs": {"choice": ["blue", "green"]}}, "/v1/completions"),
        {"messages": ASK, "max_tokens": 40, "temperature": 0, "response_format": tag},
        {"messages": ASK, "max_tokens": 5, "response_format": {"type": "text"}})
    assert all(t["logprob"] >= -9999.0
               for t in out["choices"][0]["logprobs"]["content"][0]["top_logprobs"])
    assert isinstance(json.loads(obj["choices"][0]["message"]["content"]), dict)
    assert completion["choices"][0]["text"] in ("blue", "green")
    head, _, rest = tagged["choices"][0]["message"]["content"].partition("Answer: ")
    assert head == "" and isinstance(json.loads(rest)["ok"], bool)
    assert text["choices"][0]["message"]["content"]
    assert "completion_tokens_details" not in text["usage"]  # no reasoning parser


@pytest.mark.parametrize("body, message", [
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "bogus"}}}}}},
     "bogus"),
    ({"structured_outputs": {"regex": {"1": "Python"}}}, "structured_outputs.regex"),
    ({"structured_outputs": {"regex": "(unclosed"}}, "regex"),
    ({"structured_outputs": {"grammar": "root ::= (("}}, "grammar"),
    ({"structured_outputs": {"json": "{not json"}}, "Invalid JSON grammar"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "one kind of constraints"),
    ({"structured_outputs": {"nope": 1}}, "unknown fields"),
    ({"structured_outputs": {"choice": ["a"]}, "tools": TOOLS,
      "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
     "either use constraints for structured outputs or tools"),
    ({"response_format": {"type": "yaml"}}, "response_format type must be one of"),
])
def test_malformed_constraints_are_400_and_the_next_request_succeeds(client, body, message):
    status, out = call(client, {"messages": ASK, "max_tokens": 5, **body})
    assert status == 400 and out["error"]["type"] == "BadRequestError", out
    assert message in out["error"]["message"]
    # greedy, and room for "fine" spelled one character a token (the grammar allows it)
    after = ok(client, {"messages": ASK, "max_tokens": 6, "temperature": 0,
                        "structured_outputs": {"choice": ["fine"]}})
    assert after["choices"][0]["message"]["content"] == "fine"


def test_a_grammar_failing_after_validation_fails_only_its_request(client, monkeypatch):
    manager = client.engine.structured_output_manager

    def broken(request, backend):
        raise InvalidArgumentError("Failed to compile the structured output grammar: boom")

    monkeypatch.setattr(manager, "_create_grammar", broken)
    healthy = handle_openai_request(client, "POST", "/v1/chat/completions", json.dumps(
        {"messages": ASK, "max_tokens": 8, "stream": True}), served_model_name="smol")
    failing = handle_openai_request(client, "POST", "/v1/chat/completions", json.dumps(
        {"messages": ASK, "max_tokens": 8, "structured_outputs": {"regex": "a+"}}),
        served_model_name="smol")
    assert failing.status == 400 and "boom" in json.loads(failing.body)["error"]["message"]
    monkeypatch.undo()
    chunks = []
    while (chunk := healthy.stream.get(60)) != "":
        chunks.append(json.loads(chunk))
    assert streamed_choices(chunks)[0]["finish"] == "length"
    stats = client.get_stats()
    assert stats["request_success"]["error"] >= 1


@pytest.fixture(scope="module")
def required_tool_calls(client):
    """The request of the test below, streamed and not, and the one of
    test_named_tool_choice_finishes_with_stop, all three in flight together."""
    # the hermes envelope (<tool_call>, the name) costs ~40 of SmolLM2's tokens
    named = {"messages": WEATHER, "tools": TOOLS, "temperature": 0, "max_tokens": 120,
             "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    full, streamed, named_out = ok_together(client, *(
        {"messages": WEATHER, "tools": TOOLS, "tool_choice": "required",
         "parallel_tool_calls": False, "temperature": 0, "max_tokens": 80, "stream": stream}
        for stream in (False, True)), named)
    return {False: full, True: streamed, "named": named_out}


@pytest.mark.parametrize("stream", [False, True], ids=["full", "streamed"])
def test_required_tool_choice_calls_a_tool(required_tool_calls, stream):
    out = required_tool_calls[stream]
    if stream:
        choice = streamed_choices(out)[0]
        (deltas,) = choice["calls"].values()  # parallel_tool_calls false: one call
        first, rest = deltas[0], deltas[1:]
        assert first["id"].startswith("chatcmpl-tool-") and first["type"] == "function"
        assert all("id" not in d and "name" not in d["function"] for d in rest)
        name = first["function"]["name"]
        arguments = "".join(d["function"].get("arguments") or "" for d in deltas)
        finish = choice["finish"]
    else:
        message = out["choices"][0]["message"]
        (tool_call,) = message["tool_calls"]
        assert message["content"] == "" and tool_call["id"].startswith("chatcmpl-tool-")
        name, arguments = tool_call["function"]["name"], tool_call["function"]["arguments"]
        finish = out["choices"][0]["finish_reason"]
    schema = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}[name]
    jsonschema.validate(json.loads(arguments), schema)
    assert finish == "tool_calls"


def test_named_tool_choice_finishes_with_stop(required_tool_calls):
    out = required_tool_calls["named"]
    choice = out["choices"][0]
    (tool_call,) = choice["message"]["tool_calls"]
    assert tool_call["function"]["name"] == "get_weather" and choice["finish_reason"] == "stop"
    jsonschema.validate(json.loads(tool_call["function"]["arguments"]),
                        TOOLS[0]["function"]["parameters"])


def test_auto_and_none_and_the_server_flags(client):
    """auto: the hermes parser finds no <tool_call> in this model's answer, so it is plain
    content with finish_reason from the engine; none: tools rendered, nothing parsed.
    online_renderer.py: without a parser (vLLM makes none unless --enable-auto-tool-choice)
    auto, required and named are refused by name."""
    for out in ok_together(client, *({"messages": WEATHER, "tools": TOOLS, "tool_choice": c,
                                      "max_tokens": 4, "temperature": 0}
                                     for c in ("auto", "none"))):
        message = out["choices"][0]["message"]
        assert "tool_calls" not in message and message["content"]
        assert out["choices"][0]["finish_reason"] == "length"
    request = ChatCompletionRequest.model_validate({"messages": WEATHER, "tools": TOOLS})
    with pytest.raises(VLLMValidationError, match='^"auto" tool choice requires '
                       "--enable-auto-tool-choice and --tool-call-parser to be set$"):
        check_tool_choice(request, None, False)
    for choice, desc in (("required", '"required"'), (
            {"type": "function", "function": {"name": "get_time"}}, 'function "get_time"')):
        request = ChatCompletionRequest.model_validate(
            {"messages": WEATHER, "tools": TOOLS, "tool_choice": choice})
        with pytest.raises(VLLMValidationError,
                           match=f"^tool_choice={desc} requires --tool-call-parser to be set$"):
            check_tool_choice(request, None, False)
