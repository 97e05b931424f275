"""Property-based fuzz of /v1/completions and /v1/chat/completions through examples/server
: request bodies built from every request field of vLLM's CompletionRequest and
ChatCompletionRequest (vllm/entrypoints/openai/{completion,chat_completion}/protocol.py),
each set to a plausible value, a wrong-typed one or junk JSON. Properties: never a 5xx (nor
an error event with a 5xx code inside a stream), an error body always has vLLM's shape,
never a traceback in the server log, and the engine still serves afterwards. Bounded
(derandomized, a fixed example count, generation capped at a few tokens) so it runs in CI.
"""

from __future__ import annotations

import json
import os

import pytest
from hostile_server import (
    JSON,
    MODEL,
    no_traceback,
    request,
    served,
    server_fixture,
)

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

pytestmark = [pytest.mark.capi, pytest.mark.slow]

# per endpoint (CI: 25, ~0.3 s each on the 2-core CPU machine); VLLM_FUZZ_EXAMPLES explores more
EXAMPLES = int(os.environ.get("VLLM_FUZZ_EXAMPLES", "25"))

_junk = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats()
    | st.text(max_size=12), lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)
_small = st.integers(-3, 3)
_prob = st.one_of(st.floats(-1, 3), st.sampled_from([0, 1, float("inf")]))
_text = st.text(max_size=40)


def _field(typed):
    """A plausible value most of the time, else a wrong type or junk."""
    return st.one_of(typed, typed, typed, _junk)


_max_tokens = st.one_of(st.integers(1, 3), st.integers(1, 3), _small, st.integers(2**31, 2**64),
                        st.sampled_from(["2", 1.5, [], {}]))
_sampling = {
    "temperature": _field(_prob), "top_p": _field(_prob), "top_k": _field(_small),
    "min_p": _field(_prob), "n": _field(st.integers(-1, 3)), "seed": _field(st.integers()),
    "stop": _field(st.one_of(_text, st.lists(_text, max_size=3))),
    "stream": _field(st.booleans()),
    "stream_options": _field(st.fixed_dictionaries({}, optional={
        "include_usage": st.booleans(), "continuous_usage_stats": st.booleans()})),
    "presence_penalty": _field(st.floats(-3, 3)), "frequency_penalty": _field(st.floats(-3, 3)),
    "repetition_penalty": _field(st.floats(-1, 3)), "min_tokens": _field(_small),
    "ignore_eos": _field(st.booleans()),
    "logit_bias": _field(st.dictionaries(st.sampled_from(["0", "1", "-1", "99999999", "x"]),
                                         st.floats(-200, 200), max_size=2)),
    "stop_token_ids": _field(st.lists(st.integers(-2, 70000), max_size=2)),
    "skip_special_tokens": _field(st.booleans()),
    "truncate_prompt_tokens": _field(st.integers(-2, 600)),
    "response_format": _field(st.sampled_from([
        {"type": "json_object"}, {"type": "text"}, {"type": "json_schema"},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer"}}},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}},
        {"type": "structural_tag"}, {"type": "grammar"}])),
    "structured_outputs": _field(st.sampled_from([
        {"regex": "[a-z]+"}, {"regex": "("}, {"choice": ["a", "b"]}, {"choice": []},
        {"grammar": "root ::= 'x'"}, {"grammar": "root ::="}, {"json": {"type": "object"}},
        {"regex": "a", "choice": ["a"]}])),
    "allowed_token_ids": _field(st.lists(st.integers(-2, 70000), max_size=2)),
    "bad_words": _field(st.lists(_text, max_size=2)),
    "user": _field(_text), "priority": _field(_small), "request_id": _field(_text),
    "add_special_tokens": _field(st.booleans()), "return_token_ids": _field(st.booleans()),
    "prompt_logprobs": _field(_small), "model": _field(st.sampled_from([MODEL, "gpt-4", ""])),
    "cache_salt": _field(_text), "vllm_xargs": _field(st.dictionaries(_text, _small)),
}
_completion_fields = {
    **_sampling, "echo": _field(st.booleans()), "logprobs": _field(st.integers(-2, 25)),
    "suffix": _field(_text), "best_of": _field(_small), "use_beam_search": _field(
        st.booleans()),
}
_message = st.fixed_dictionaries(
    {"role": _field(st.sampled_from(["user", "assistant", "system", "tool", "developer"]))},
    optional={"content": _field(st.one_of(_text, st.lists(st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "image_url"]), "text": _text}), max_size=2))),
        "tool_calls": _junk, "name": _text, "tool_call_id": _text})
_tool = _field(st.fixed_dictionaries({"type": st.sampled_from(["function", "x"]),
                                      "function": _field(st.fixed_dictionaries(
                                          {"name": _field(_text)},
                                          optional={"parameters": _junk}))}))
_chat_fields = {
    **_sampling, "logprobs": _field(st.booleans()), "top_logprobs": _field(st.integers(-2, 25)),
    "max_completion_tokens": _max_tokens, "tools": _field(st.lists(_tool, max_size=2)),
    "tool_choice": _field(st.one_of(st.sampled_from(["none", "auto", "required", "x"]),
                                    st.fixed_dictionaries({"type": st.just("function"),
                                                           "function": _junk}))),
    "parallel_tool_calls": _field(st.booleans()),
    "add_generation_prompt": _field(st.booleans()),
    "continue_final_message": _field(st.booleans()),
    "echo": _field(st.booleans()), "chat_template_kwargs": _field(st.dictionaries(
        st.sampled_from(["enable_thinking", "messages", "x"]), _junk, max_size=2)),
    "chat_template": _field(st.sampled_from(["{{ x }}", "{% for %}"])),
    "reasoning_effort": _field(st.sampled_from(["low", "high"])),
    "include_reasoning": _field(st.booleans()),
    "documents": _field(st.lists(st.dictionaries(_text, _text, max_size=2), max_size=1)),
}


def _bodies(fields: dict, required: dict):
    """A few of the fields at a time (so that many bodies are valid and reach the engine);
    max_tokens is always small or invalid: generation stays short."""
    return st.lists(st.sampled_from(sorted(fields)), max_size=4, unique=True).flatmap(
        lambda names: st.fixed_dictionaries({"max_tokens": _max_tokens, **required,
                                             **{name: fields[name] for name in names}}))


_words = st.text(st.characters(codec="utf-8"), min_size=1, max_size=40)
_completion_bodies = _bodies(_completion_fields, {"prompt": _field(st.one_of(
    _words, _words, st.lists(_text, min_size=1, max_size=2),
    st.lists(st.integers(-2, 70000), max_size=4)))})
_plain_message = st.fixed_dictionaries({"role": st.sampled_from(["user", "system"]),
                                        "content": _words})
_chat_bodies = _bodies(_chat_fields, {"messages": _field(st.one_of(
    st.lists(_plain_message, min_size=1, max_size=3), st.lists(_message, max_size=3)))})


server = server_fixture("fuzz")


def _check(server, path: str, body: dict) -> None:
    port, log = server
    try:
        data = json.dumps(body, allow_nan=True)
    except (ValueError, TypeError):
        return
    status, headers, text = request(port, "POST", path, body=data.encode(), headers=JSON)
    event(f"status {status}")  # --hypothesis-show-statistics: how many reached the engine
    assert 200 <= status < 500, (status, data[:500], text[:500])
    if status != 200:
        error = json.loads(text)["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
    elif headers.get("content-type", "").startswith("text/event-stream"):
        events = [json.loads(line[6:]) for line in text.splitlines()
                  if line.startswith("data: {")]
        codes = [e["error"]["code"] for e in events if "error" in e]
        assert all(code < 500 for code in codes), (data[:500], codes)
    no_traceback(log)


_fuzz = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                 suppress_health_check=list(HealthCheck))


@_fuzz
@given(body=_completion_bodies)
def test_fuzz_completions(server, body):
    _check(server, "/v1/completions", body)


@_fuzz
@given(body=_chat_bodies)
def test_fuzz_chat_completions(server, body):
    _check(server, "/v1/chat/completions", body)


def test_engine_still_serves(server):
    served(server[0])
    no_traceback(server[1])
