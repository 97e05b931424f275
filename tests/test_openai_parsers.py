"""Reasoning and auto tool-call parsing in /v1/chat/completions, streamed and not, on
recorded model-style outputs (Qwen3 / Hermes markup) replayed token by token.

The client is scripted: its engine has the default model's tokenizer with the model-family
markers added (as tests/test_reasoning_parsers.py), --reasoning-parser qwen3,
--tool-call-parser hermes and --enable-auto-tool-choice, and every request "generates" the
recorded text. Oracles: the recorded text itself (reasoning = what is inside <think>, content
= what follows, tool calls = the JSON inside <tool_call>), vLLM's message assembly
(tests/entrypoints/openai/chat_completion/test_message_assembly.py: tool_calls left out when
empty, finish_reason tool_calls, include_reasoning=false hides reasoning) and the streaming
contract of the openai client (id and name once per tool index, argument fragments that
concatenate to the non-streamed arguments).
"""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import pytest
from tokenizers.decoders import DecodeStream

from libvllm.engine.config import EngineConfig
from libvllm.engine.entrypoints.openai.api import handle_openai_request
from libvllm.engine.gguf.reader import GGUFReader
from libvllm.engine.outputs import CompletionOutput, RequestOutput
from libvllm.engine.tokenizer import Tokenizer
from tests.test_reasoning_parsers import MARKERS

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
REASONED_CALLS = (
    "<think>The user wants weather for two cities.</think>\n\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lima, Peru"}}\n</tool_call>')
REASONED_ANSWER = "<think>Simple greeting.</think>\n\nHello! How can I help?"


class ScriptedClient:
    """AsyncLLM's interface; each request streams `script` one token per output."""

    def __init__(self, tokenizer, script: str) -> None:
        self.lock = threading.RLock()
        self.script = script
        self.reasoning_kwargs = []
        self.engine = SimpleNamespace(
            tokenizer=tokenizer, model_info=SimpleNamespace(max_model_len=4096),
            default_sampling_params={}, config=EngineConfig(
                model="scripted", reasoning_parser="qwen3", tool_call_parser="hermes",
                enable_auto_tool_choice=True))

    def add_request(self, request_id, prompt, params, reasoning_parser_kwargs=None,
                    priority=0, cache_salt=None):
        self.reasoning_kwargs.append(reasoning_parser_kwargs)
        tok = self.engine.tokenizer
        ids = tok.encode(self.script, add_special_tokens=False)
        decoder = DecodeStream(skip_special_tokens=params.skip_special_tokens)
        outputs = [RequestOutput(request_id, None, list(prompt), outputs=[CompletionOutput(
            0, decoder.step(tok.backend, t) or "", [t],
            finish_reason="stop" if i == len(ids) - 1 else None)],
            finished=i == len(ids) - 1) for i, t in enumerate(ids)]
        return SimpleNamespace(get=lambda timeout_s: _next(outputs), cancel=lambda: None)


def _next(outputs):
    if not outputs:
        raise EOFError
    return outputs.pop(0)


@pytest.fixture(scope="module")
def tokenizer(model_path) -> Tokenizer:
    """The default model's tokenizer with the markers as user-defined (added, not special)
    tokens, as Qwen3's tokenizer has <think> and <tool_call>: they survive
    skip_special_tokens, so the text the parsers see holds them."""
    with GGUFReader(model_path) as reader:
        md = dict(reader.metadata)
    md["tokenizer.ggml.tokens"] = [*md["tokenizer.ggml.tokens"], *MARKERS]
    md["tokenizer.ggml.token_type"] = [*md["tokenizer.ggml.token_type"], *[4] * len(MARKERS)]
    return Tokenizer.from_gguf_metadata(md)


def chat(client, stream: bool, **body):
    body = {"messages": [{"role": "user", "content": "Weather in Paris and Lima?"}],
            "stream": stream, **body}
    res = handle_openai_request(client, "POST", "/v1/chat/completions", json.dumps(body),
                                served_model_name="m")
    assert res.status == 200, res.body
    if not stream:
        return json.loads(res.body)["choices"][0]
    chunks = []
    while (chunk := res.stream.get(10)) != "":
        chunks.append(json.loads(chunk))
    return [c["choices"][0] for c in chunks if c["choices"]]


def test_reasoning_and_tool_calls_full(tokenizer):
    client = ScriptedClient(tokenizer, REASONED_CALLS)
    choice = chat(client, False, tools=TOOLS)
    message = choice["message"]
    assert message["reasoning"] == "The user wants weather for two cities."
    assert [json.loads(c["function"]["arguments"]) for c in message["tool_calls"]] == [
        {"city": "Paris"}, {"city": "Lima, Peru"}]
    assert {c["function"]["name"] for c in message["tool_calls"]} == {"get_weather"}
    assert len({c["id"] for c in message["tool_calls"]}) == 2
    assert not (message["content"] or "").strip()
    assert choice["finish_reason"] == "tool_calls"
    assert client.reasoning_kwargs == [{"chat_template_kwargs": {}}]


def test_reasoning_and_tool_calls_streamed(tokenizer):
    client = ScriptedClient(tokenizer, REASONED_CALLS)
    choices = chat(client, True, tools=TOOLS)
    reasoning = "".join(c["delta"].get("reasoning") or "" for c in choices)
    assert reasoning == "The user wants weather for two cities."
    calls: dict[int, list] = {}
    for c in choices:
        for d in c["delta"].get("tool_calls") or []:
            calls.setdefault(d["index"], []).append(d)
    assert sorted(calls) == [0, 1]
    for index, city in ((0, "Paris"), (1, "Lima, Peru")):
        first, *rest = calls[index]
        assert first["id"].startswith("chatcmpl-tool-") and first["type"] == "function"
        assert first["function"]["name"] == "get_weather"
        assert all("id" not in d and not d["function"].get("name") for d in rest)
        args = "".join(d["function"].get("arguments") or "" for d in calls[index])
        assert json.loads(args) == {"city": city}
    assert choices[-1]["finish_reason"] == "tool_calls"
    assert choices[0]["delta"] == {"role": "assistant", "content": ""}


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_then_content(tokenizer, stream):
    client = ScriptedClient(tokenizer, REASONED_ANSWER)
    out = chat(client, stream)
    if stream:
        reasoning = "".join(c["delta"].get("reasoning") or "" for c in out)
        content = "".join(c["delta"].get("content") or "" for c in out)
        finish = out[-1]["finish_reason"]
        assert not any(c["delta"].get("tool_calls") for c in out)
    else:
        reasoning, content = out["message"]["reasoning"], out["message"]["content"]
        finish = out["finish_reason"]
        assert "tool_calls" not in out["message"]
    assert reasoning == "Simple greeting." and content.strip() == "Hello! How can I help?"
    assert finish == "stop"


def test_usage_counts_reasoning_tokens(tokenizer):
    """completion_tokens_details.reasoning_tokens (a reasoning parser is set): the tokens
    between the markers (oracle: the tokenizer on the reasoning text alone)."""
    client = ScriptedClient(tokenizer, REASONED_ANSWER)
    want = len(tokenizer.encode("Simple greeting.", add_special_tokens=False))
    body = {"messages": [{"role": "user", "content": "Hi"}]}
    res = handle_openai_request(client, "POST", "/v1/chat/completions", json.dumps(body),
                                served_model_name="m")
    usage = json.loads(res.body)["usage"]
    assert usage["completion_tokens_details"] == {"reasoning_tokens": want}
    res = handle_openai_request(client, "POST", "/v1/chat/completions", json.dumps(
        {**body, "stream": True, "stream_options": {"include_usage": True}}),
        served_model_name="m")
    chunks = []
    while (chunk := res.stream.get(10)) != "":
        chunks.append(json.loads(chunk))
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens_details"] == {"reasoning_tokens": want}


@pytest.mark.parametrize("stream", [False, True])
def test_include_reasoning_false_hides_it(tokenizer, stream):
    client = ScriptedClient(tokenizer, REASONED_ANSWER)
    out = chat(client, stream, include_reasoning=False)
    if stream:
        assert not any(c["delta"].get("reasoning") for c in out)
        content = "".join(c["delta"].get("content") or "" for c in out)
    else:
        assert out["message"]["reasoning"] is None
        content = out["message"]["content"]
    assert content.strip() == "Hello! How can I help?"


def test_thinking_disabled_is_all_content(tokenizer):
    """Qwen3 with chat_template_kwargs enable_thinking=false: no reasoning split, and the
    kwargs reach the engine's reasoning gate."""
    client = ScriptedClient(tokenizer, "Hello! How can I help?")
    out = chat(client, False, chat_template_kwargs={"enable_thinking": False})
    assert out["message"]["content"] == "Hello! How can I help?"
    assert out["message"]["reasoning"] is None
    assert client.reasoning_kwargs == [{"chat_template_kwargs": {"enable_thinking": False}}]


def test_reasoning_effort_none_disables_thinking_for_the_parsers(tokenizer):
    """reasoning_effort "none" renders with enable_thinking=false (vLLM's build_chat_params),
    and the front-end parser and the engine's reasoning gate get the same kwargs (vLLM's
    merged chat template kwargs): the answer is content, not reasoning."""
    client = ScriptedClient(tokenizer, "Hello! How can I help?")
    out = chat(client, False, reasoning_effort="none")
    assert out["message"]["content"] == "Hello! How can I help?"
    assert out["message"]["reasoning"] is None
    assert client.reasoning_kwargs == [{"chat_template_kwargs": {
        "enable_thinking": False, "reasoning_effort": "none"}}]


def test_tool_choice_none_leaves_markup_as_content(tokenizer):
    client = ScriptedClient(tokenizer, REASONED_CALLS)
    out = chat(client, False, tools=TOOLS, tool_choice="none")
    assert "tool_calls" not in out["message"] and out["finish_reason"] == "stop"
    assert '"city": "Paris"' in out["message"]["content"]
