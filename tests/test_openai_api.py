"""The OpenAI layer (engine/entrypoints/openai) driven in-process on the real default model.

Checks request validation (status, error type, message, param), defaults (max_tokens 16
for completions, context fill for chat), response and stream chunk shapes, usage,
stream_options, n > 1 indices, echo, tokenize/detokenize, the "not supported yet" refusals
and cancellation. Oracles: vLLM 0.33's messages and shapes (the upstream files named per
test, under tests/entrypoints/openai/ and vllm/entrypoints/openai/), and the engine itself
(AsyncLLM with plain SamplingParams) for generated text and token counts.
Ports cases of tests/entrypoints/openai/completion/{test_completion,test_completion_error,
test_prompt_validation}.py, chat_completion/{test_chat,test_chat_error,
test_non_object_body_validation}.py and models/test_models.py.
"""

from __future__ import annotations

import inspect
import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from libvllm.engine.async_llm import AsyncLLM, EngineDeadError
from libvllm.engine.config import EngineConfig
from libvllm.engine.entrypoints.openai.api import handle_openai_request
from libvllm.engine.entrypoints.openai.chat_protocol import ChatCompletionRequest
from libvllm.engine.entrypoints.openai.completion_protocol import CompletionRequest
from libvllm.engine.entrypoints.openai.logprobs import chat_logprobs, completion_logprobs
from libvllm.engine.llm_engine import LLMEngine
from libvllm.engine.sampling_params import SamplingParams

MODEL = "smol"
MAX_MODEL_LEN = 512
HELLO = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def client(model_path):
    engine = LLMEngine.from_config(EngineConfig(
        model=model_path, device="cpu", max_model_len=MAX_MODEL_LEN, max_num_seqs=8))
    llm = AsyncLLM(engine)
    yield llm
    llm.shutdown()


class Spy:
    """The client, recording the SamplingParams of every request it is given."""

    def __init__(self, client):
        self._client, self.params, self.kwargs = client, [], []
        self.engine, self.lock = client.engine, client.lock

    def add_request(self, request_id, prompt, params, **kwargs):
        self.params.append(params)
        self.kwargs.append(kwargs)
        return self._client.add_request(request_id, prompt, params, **kwargs)


def call(client, endpoint, body, method="POST"):
    text = body if isinstance(body, str) else json.dumps(body)
    res = handle_openai_request(client, method, endpoint, text, served_model_name=MODEL)
    assert (res.body is None) != (res.stream is None)
    return res


def ok(client, endpoint, body, method="POST"):
    res = call(client, endpoint, body, method)
    assert res.status == 200, res.body
    return json.loads(res.body)


def err(client, endpoint, body, status=400):
    res = call(client, endpoint, body)
    assert res.status == status, res.body
    error = json.loads(res.body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
    return error


def chunks(res, timeout=60.0):
    assert res.status == 200 and res.stream is not None
    out = []
    while (chunk := res.stream.get(timeout)) != "":
        assert chunk is not None, "stream timed out"
        out.append(json.loads(chunk))
    return out


def engine_greedy(client, prompt_ids, max_tokens, stop=None):
    """The oracle: the engine itself, without the OpenAI layer."""
    stream = client.add_request("oracle", list(prompt_ids), SamplingParams(
        temperature=0.0, max_tokens=max_tokens, stop=stop))
    text, ids, finish = "", [], None
    while True:
        try:
            out = stream.get(60)
        except EOFError:
            return text, ids, finish
        text += out.outputs[0].text
        ids += out.outputs[0].token_ids
        finish = out.outputs[0].finish_reason


def encode(client, text, special=True):
    with client.lock:
        return client.engine.tokenizer.encode(text, add_special_tokens=special)


# ---------------------------------------------------------------- validation (400 / 404)

@pytest.mark.parametrize("body, message, param", [
    # completion/test_completion.py::test_completion_stream_options
    ({"prompt": "x", "stream_options": {"include_usage": True}},
     "Stream options can only be defined when `stream=True`.", "stream_options"),
    # completion/test_completion_error.py::test_logprobs_below_minus_one_rejected
    ({"prompt": "x", "logprobs": -2}, "must be a positive value or -1", "logprobs"),
    # completion/test_completion_error.py::test_non_numeric_logprobs_rejected
    ({"prompt": "x", "logprobs": "2"}, "`logprobs` must be an integer.", "logprobs"),
    ({"prompt": "x", "prompt_logprobs": "2"}, "`prompt_logprobs` must be an integer.",
     "prompt_logprobs"),
    # completion/test_prompt_validation.py::test_empty_prompt
    ({"prompt": None}, "Either prompt or prompt_embeds must be provided and non-empty.",
     "prompt"),
    ({"prompt": ""}, "Either prompt or prompt_embeds must be provided and non-empty.", "prompt"),
    # completion/test_completion_error.py::TestCompletionPromptListLimit
    ({"prompt": ["a"] * 1025}, "prompt list length 1025 exceeds the maximum allowed count",
     "prompt"),
    # chat_completion/test_non_object_body_validation.py (cache_salt case)
    ({"prompt": "x", "cache_salt": ""}, "'cache_salt' must be a non-empty string", "cache_salt"),
    # completion/test_completion_error.py::test_json_schema_response_format_missing_schema
    ({"prompt": "x", "response_format": {"type": "json_schema"}},
     "the 'json_schema' field must be provided", "response_format"),
])
def test_completion_request_validation(client, body, message, param):
    error = err(client, "/v1/completions", {"model": MODEL, **body})
    assert message in error["message"] and error["param"] == param
    assert error["type"] == "BadRequestError"


@pytest.mark.parametrize("prompt", [[-1], [[-1]]])
def test_negative_prompt_token_ids(client, prompt):
    """completion/test_completion_error.py::test_negative_prompt_token_ids_{flat,nested}:
    pydantic's message, type "Bad Request" as vLLM's RequestValidationError handler."""
    error = err(client, "/v1/completions", {"prompt": prompt})
    assert "greater than or equal to 0" in error["message"]
    assert error["type"] == "Bad Request" and "validation error" in error["message"]
    assert error["param"] == "prompt.0"


@pytest.mark.parametrize("body, message, param", [
    # chat_completion/test_chat.py::test_long_seed
    ({"messages": HELLO, "seed": 2**63}, "less than or equal to", "seed"),
    ({"messages": HELLO, "seed": -(2**63) - 1}, "greater than or equal to", "seed"),
    # StopParam: at most VLLM_MAX_STOP_STRINGS = 4 stop strings
    ({"messages": HELLO, "stop": ["a", "b", "c", "d", "e"]}, "at most 4 items", "stop"),
    ({"messages": HELLO, "n": "two"}, "valid integer", "n"),
    ({"model": MODEL}, "Field required", "messages"),
])
def test_schema_errors(client, body, message, param):
    """pydantic schema errors: 400 "Bad Request" (vLLM's RequestValidationError handler)."""
    error = err(client, "/v1/chat/completions", body)
    assert message in error["message"] and error["param"] == param
    assert error["type"] == "Bad Request"


@pytest.mark.parametrize("endpoint, model, base", [
    ("/v1/completions", CompletionRequest, {"prompt": "Hi"}),
    ("/v1/chat/completions", ChatCompletionRequest, {"messages": HELLO})])
def test_hostile_field_values_never_500(client, endpoint, model, base):
    """Every request field set to a wrong-typed or edge value: a response or a 4xx, never
    a 500 (hostile input is normal input). Eight in flight at once: the accepted ones
    share the engine's steps, beside the refused ones."""
    def one(field: str, value) -> None:
        res = call(client, endpoint, {**base, "max_tokens": 1, field: value})
        if res.stream is not None:
            res.stream.cancel()
            assert all(c.get("error", {}).get("code") != 500 for c in chunks(res))
        assert res.status < 500, (field, value, res.body)

    cases = [(f, v) for f in model.model_fields for v in (None, "x", -1, {}, [1])]
    with ThreadPoolExecutor(8) as pool:
        for done in [pool.submit(one, *case) for case in cases]:
            done.result()


def test_out_of_vocab_token_ids(client):
    """completion/test_prompt_validation.py::test_out_of_vocab_token_ids."""
    error = err(client, "/v1/completions", {"prompt": [999999], "max_tokens": 5})
    assert "out of vocabulary" in error["message"]


@pytest.mark.parametrize("payload", ["this is not valid json{{{", ["not", "an", "object"], 42,
                                     None])
def test_non_object_body(client, payload):
    """chat_completion/test_non_object_body_validation.py: 4xx, never a 500."""
    body = payload if isinstance(payload, str) else json.dumps(payload)
    for endpoint in ("/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"):
        error = err(client, endpoint, body)
        assert error["type"] == "Bad Request"


@pytest.mark.parametrize("body, message, param", [
    # chat_completion/test_chat.py logprobs checks (check_logprobs validator)
    ({"top_logprobs": 2}, "when using `top_logprobs`, `logprobs` must be set to true.",
     "top_logprobs"),
    ({"logprobs": True, "top_logprobs": -2}, "must be a positive value or -1", "top_logprobs"),
    # chat_completion/test_chat_error.py::test_non_numeric_logprobs_rejected
    ({"logprobs": True, "top_logprobs": "2"}, "`top_logprobs` must be an integer.",
     "top_logprobs"),
    ({"tools": []}, "`tools` must not be an empty array.", "tools"),
    ({"tool_choice": "auto"}, "When using `tool_choice`, `tools` must be set.", "tool_choice"),
    ({"continue_final_message": True, "add_generation_prompt": True},
     "Cannot set both `continue_final_message` and `add_generation_prompt` to True.", None),
    # add_generation_prompt left at its default: transformers' apply_chat_template refuses it
    ({"continue_final_message": True},
     "continue_final_message and add_generation_prompt are not compatible.",
     "continue_final_message"),
    ({"chat_template": "{{ messages }}"}, "Refused request with untrusted chat template.", None),
    # chat_completion/test_chat.py::test_chat_completion_request_rejects_unknown_reasoning_effort
    ({"reasoning_effort": "extra_high"}, "Input should be", "reasoning_effort"),
])
def test_chat_request_validation(client, body, message, param):
    error = err(client, "/v1/chat/completions", {"messages": HELLO, **body})
    assert message in error["message"] and error["param"] == param


@pytest.mark.parametrize("endpoint, body", [
    ("/v1/completions", {"prompt": "x"}),
    ("/v1/chat/completions", {"messages": HELLO}),
    ("/tokenize", {"prompt": "x"}),
    ("/detokenize", {"tokens": [1]}),
])
def test_unknown_model_is_404(client, endpoint, body):
    """vllm/entrypoints/serve/engine/serving.py::_check_model message and type."""
    error = err(client, endpoint, {"model": "gpt-4", **body}, status=404)
    assert error == {"message": f"The model `gpt-4` does not exist. Valid aliases: {MODEL}.",
                     "type": "NotFoundError", "param": "model", "code": 404}


def test_prompt_longer_than_context(client):
    """vllm/renderers/params.py::_token_len_check, with both counts in the message."""
    error = err(client, "/v1/completions", {"prompt": [42] * (MAX_MODEL_LEN + 3)})
    assert error["message"].startswith(
        f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, your "
        f"prompt contains {MAX_MODEL_LEN + 3} input tokens")
    assert error["param"] == "input_tokens"
    long_chat = [{"role": "user", "content": "hello " * MAX_MODEL_LEN}]
    assert "maximum context length" in err(
        client, "/v1/chat/completions", {"messages": long_chat})["message"]


@pytest.mark.parametrize("body, message", [
    ({"max_tokens": -1}, "max_tokens must be at least 1, got -1."),
    ({"max_tokens": 0}, "max_tokens must be at least 1, got 0."),
    ({"max_tokens": MAX_MODEL_LEN + 1},
     f"max_tokens={MAX_MODEL_LEN + 1} cannot be greater than max_model_len={MAX_MODEL_LEN}"),
    ({"n": 16385, "temperature": 1.0}, "n must be at most 16384, got 16385."),
    ({"n": 2, "temperature": 0.0}, "n must be 1 when using greedy sampling, got 2."),
    ({"temperature": 5}, "temperature must be in [0, 2], got 5"),
])
def test_sampling_params_validation(client, body, message):
    """vllm/sampling_params.py::_verify_args messages, surfaced as 400 before any output."""
    error = err(client, "/v1/completions", {"prompt": "Hi", **body})
    assert message in error["message"] and error["type"] == "BadRequestError"


@pytest.mark.parametrize("endpoint, field, value", [
    ("/v1/completions", "suffix", "end"),
    ("/v1/chat/completions", "kv_transfer_params", {"x": 1}),
])
def test_unsupported_fields_are_refused(client, endpoint, field, value):
    """Fields of features the engine lacks: a clear 400, never silently ignored."""
    base = {"messages": HELLO} if "chat" in endpoint else {"prompt": "Hi"}
    error = err(client, endpoint, {**base, field: value})
    assert error["message"] == f"`{field}` is not supported yet by this server."
    assert error["param"] == field


@pytest.mark.parametrize("endpoint, base", [("/v1/completions", {"prompt": "Hi"}),
                                            ("/v1/chat/completions", {"messages": HELLO})])
def test_priority_and_cache_salt_reach_the_engine(client, endpoint, base):
    """vLLM's request fields priority and cache_salt (refused before as unsupported) go
    with every engine request of the call, n children included."""
    spy = Spy(client)
    ok(spy, endpoint, {**base, "max_tokens": 2, "n": 2, "temperature": 1.0, "priority": -3,
                       "cache_salt": "tenant-a"})
    assert [(k["priority"], k["cache_salt"]) for k in spy.kwargs] == [(-3, "tenant-a")] * 2
    ok(spy, endpoint, {**base, "max_tokens": 2})
    assert (spy.kwargs[-1]["priority"], spy.kwargs[-1]["cache_salt"]) == (0, None)


def test_sampling_fields_follow_the_engine(client):
    """A request field whose SamplingParams counterpart does not exist is refused by name;
    one that exists is accepted (oracle: SamplingParams' own signature)."""
    fields = inspect.signature(SamplingParams).parameters
    for name, value, sampling_name in (
            ("presence_penalty", 0.5, "presence_penalty"), ("logit_bias", {"42": 1.0},
                                                            "logit_bias"),
            ("allowed_token_ids", [42], "allowed_token_ids"), ("bad_words", ["x"], "bad_words"),
            ("stream_interval", 2, "stream_interval"), ("vllm_xargs", {"a": 1}, "extra_args"),
            ("repetition_detection", {"min_count": 2}, "repetition_detection")):
        res = call(client, "/v1/completions", {"prompt": "Hi", "max_tokens": 1, name: value})
        if sampling_name in fields:
            assert res.status == 200, res.body
        else:
            error = json.loads(res.body)["error"]
            assert res.status == 400 and error["param"] == name
            assert error["message"] == f"`{name}` is not supported yet by this server."


def test_extra_fields_ignored_and_routes(client):
    """chat_completion/test_chat.py::test_extra_fields_allowed; unknown path 404, wrong
    method 405 (starlette's bodies, as vLLM's http_exception_handler shapes them)."""
    body = ok(client, "/v1/chat/completions", {"messages": HELLO, "max_tokens": 2, "n": None,
                                               "extra_field": "0", "temperature": 0})
    assert body["object"] == "chat.completion"
    assert call(client, "/v1/nope", "{}").status == 404
    res = call(client, "/v1/completions", "", method="GET")
    assert res.status == 405 and json.loads(res.body)["error"]["type"] == "Method Not Allowed"


# ---------------------------------------------------------------- responses

def test_completion_matches_engine(client):
    """completion/test_completion.py::test_single_completion: shape, usage, finish_reason;
    greedy text equal to the engine's for the same prompt."""
    prompt = "The capital of France is"
    body = ok(client, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 5,
                                          "temperature": 0})
    ids = encode(client, prompt)
    text, out_ids, _ = engine_greedy(client, ids, 5)
    assert body["id"].startswith("cmpl-") and body["object"] == "text_completion"
    assert body["model"] == MODEL and isinstance(body["created"], int)
    (choice,) = body["choices"]
    assert choice == {"index": 0, "text": text, "logprobs": None, "finish_reason": "length",
                      "stop_reason": None, "token_ids": None, "prompt_logprobs": None,
                      "prompt_token_ids": None}
    assert body["usage"] == {"prompt_tokens": len(ids), "completion_tokens": len(out_ids),
                             "total_tokens": len(ids) + len(out_ids)}


def test_completion_defaults_and_stop(client):
    """max_tokens defaults to 16 (CompletionRequest), null too; a stop string gives
    finish_reason stop with stop_reason the string."""
    spy = Spy(client)
    ok(spy, "/v1/completions", {"prompt": "Hi", "temperature": 0})
    ok(spy, "/v1/completions", {"prompt": "Hi", "temperature": 0, "max_tokens": None})
    assert [p.max_tokens for p in spy.params] == [16, 16]
    prompt = "1, 2, 3, 4,"
    text, _, _ = engine_greedy(client, encode(client, prompt), 12)
    stop = text.strip()[:1]
    body = ok(client, "/v1/completions", {"prompt": prompt, "max_tokens": 12,
                                          "temperature": 0, "stop": [stop]})
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop
    assert choice["text"] == engine_greedy(client, encode(client, prompt), 12, [stop])[0]


def test_chat_max_tokens_fills_context(client):
    """ChatCompletionRequest: max_tokens None -> max_model_len - prompt_len (get_max_tokens)."""
    spy = Spy(client)
    res = call(spy, "/v1/chat/completions", {"messages": HELLO, "stream": True})
    res.stream.cancel()
    chunks(res)
    prompt_len = len(ok(client, "/tokenize", {"messages": HELLO})["tokens"])
    assert spy.params[0].max_tokens == MAX_MODEL_LEN - prompt_len


def test_chat_matches_engine(client):
    body = ok(client, "/v1/chat/completions", {"model": MODEL, "messages": HELLO,
                                               "max_tokens": 8, "temperature": 0})
    tokens = ok(client, "/tokenize", {"messages": HELLO})["tokens"]
    text, out_ids, finish = engine_greedy(client, tokens, 8)
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    (choice,) = body["choices"]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"] == text
    assert choice["finish_reason"] == finish and choice["logprobs"] is None
    assert body["usage"]["prompt_tokens"] == len(tokens)
    assert body["usage"]["completion_tokens"] == len(out_ids)


def test_completion_stream(client):
    """completion/test_completion.py::test_completion_streaming and
    test_completion_stream_options: the chunks add up to the non-streamed text; usage."""
    req = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}
    full = ok(client, "/v1/completions", req)
    got = chunks(call(client, "/v1/completions", {**req, "stream": True}))
    assert "".join(c["choices"][0]["text"] for c in got) == full["choices"][0]["text"]
    assert all(c["object"] == "text_completion" and "usage" not in c for c in got)
    assert [c["choices"][0]["finish_reason"] for c in got][-1] == "length"
    got = chunks(call(client, "/v1/completions", {
        **req, "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}}))
    final = got[-1]
    assert final["choices"] == [] and final["usage"] == full["usage"]
    assert set(final) == {"id", "object", "created", "model", "choices", "usage"}
    assert all(c["usage"]["prompt_tokens"] == full["usage"]["prompt_tokens"] for c in got)


def test_chat_stream(client):
    """chat_completion/test_chat.py::test_chat_streaming / stream_options: role chunk,
    content deltas, a finish chunk, then the usage chunk."""
    req = {"messages": HELLO, "max_tokens": 6, "temperature": 0}
    full = ok(client, "/v1/chat/completions", req)
    got = chunks(call(client, "/v1/chat/completions", {
        **req, "stream": True, "stream_options": {"include_usage": True}}))
    first = got[0]
    assert first["choices"] == [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                 "logprobs": None, "finish_reason": None}]
    assert first["object"] == "chat.completion.chunk" and "usage" not in first
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in got[1:-1])
    assert content == full["choices"][0]["message"]["content"]
    assert got[-2]["choices"][0]["finish_reason"] == full["choices"][0]["finish_reason"]
    assert got[-1]["choices"] == [] and got[-1]["usage"] == full["usage"]


def test_n_and_prompt_indices(client):
    """chat_completion/test_chat.py::test_chat_completion_n_parameter_*; completions with
    several prompts: index = prompt_idx * n + i (completion/serving.py)."""
    body = ok(client, "/v1/chat/completions", {"messages": HELLO, "n": 3, "max_tokens": 3,
                                               "temperature": 1.0, "seed": 7})
    assert sorted(c["index"] for c in body["choices"]) == [0, 1, 2]
    assert body["usage"]["completion_tokens"] == 9
    prompts = [[42, 43], [44, 45, 46]]
    body = ok(client, "/v1/completions", {"prompt": prompts, "n": 2, "max_tokens": 2,
                                          "temperature": 1.0, "seed": 3,
                                          "return_token_ids": True})
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert [c["prompt_token_ids"] for c in body["choices"]] == [prompts[0]] * 2 + [prompts[1]] * 2
    assert body["usage"]["prompt_tokens"] == 5
    got = chunks(call(client, "/v1/chat/completions", {
        "messages": HELLO, "n": 2, "max_tokens": 3, "temperature": 1.0, "stream": True}))
    assert {c["choices"][0]["index"] for c in got} == {0, 1}
    assert sum(c["choices"][0]["finish_reason"] is not None for c in got) == 2


def test_echo(client):
    """completion/serving.py echo: the prompt text is prepended; max_tokens=0 echoes only."""
    prompt = "Hello there"
    body = ok(client, "/v1/completions", {"prompt": prompt, "echo": True, "max_tokens": 0})
    assert body["choices"][0]["text"] == prompt
    body = ok(client, "/v1/completions", {"prompt": prompt, "echo": True, "max_tokens": 3,
                                          "temperature": 0})
    text, _, _ = engine_greedy(client, encode(client, prompt), 3)
    assert body["choices"][0]["text"] == prompt + text


def test_chat_prefill_and_echo(client):
    """continue_final_message cuts the render after the last message (transformers'
    apply_chat_template); chat echo prepends that message (chat_completion/serving.py)."""
    messages = [*HELLO, {"role": "assistant", "content": "Hello! I am"}]
    req = {"messages": messages, "add_generation_prompt": False,
           "continue_final_message": True}
    tokens = ok(client, "/tokenize", req)["tokens"]
    with client.lock:
        assert client.engine.tokenizer.decode(tokens, skip_special_tokens=False).endswith(
            "Hello! I am")
    body = ok(client, "/v1/chat/completions", {**req, "echo": True, "max_tokens": 3,
                                               "temperature": 0})
    text, _, _ = engine_greedy(client, tokens, 3)
    assert body["choices"][0]["message"] == {
        "role": "assistant", "content": "Hello! I am" + text, "refusal": None,
        "annotations": None, "audio": None, "function_call": None, "reasoning": None}


def test_tokenize_detokenize_models(client):
    """vllm/entrypoints/serve/tokenize/serving.py shapes; models/test_models.py card."""
    body = ok(client, "/tokenize", {"prompt": "Hello world", "return_token_strs": True})
    ids = encode(client, "Hello world")
    assert body["tokens"] == ids and body["count"] == len(ids)
    assert body["max_model_len"] == MAX_MODEL_LEN and len(body["token_strs"]) == len(ids)
    assert ok(client, "/detokenize", {"tokens": ids})["prompt"].endswith("Hello world")
    with client.lock:  # the chat form: the engine's own template render, no special tokens
        rendered = client.engine.apply_chat_template(HELLO, add_generation_prompt=True)
    assert ok(client, "/tokenize", {"messages": HELLO})["tokens"] == encode(
        client, rendered, special=False)
    models = ok(client, "/v1/models", "", method="GET")
    (card,) = models["data"]
    assert models["object"] == "list" and card["id"] == MODEL and card["owned_by"] == "vllm"
    assert card["max_model_len"] == MAX_MODEL_LEN and card["permission"][0]["allow_sampling"]


class _FailingClient(Spy):
    """Its requests fail after their first output, as when the engine loop dies."""

    def add_request(self, request_id, prompt, params, **kwargs):
        inner = super().add_request(request_id, prompt, params, **kwargs)
        outer = self

        class Stream:
            def get(self, timeout_s):
                if outer.params:
                    out = inner.get(timeout_s)
                    outer.params.clear()
                    return out
                inner.cancel()
                raise EngineDeadError("the engine loop failed: RuntimeError: boom")

            def cancel(self):
                inner.cancel()
        return Stream()


@pytest.mark.parametrize("endpoint, body", [
    ("/v1/completions", {"prompt": "Hi"}), ("/v1/chat/completions", {"messages": HELLO})])
def test_error_mid_stream(client, endpoint, body):
    """completion/test_completion_error.py::test_completion_error_stream and
    chat_completion/test_chat_error.py::test_chat_error_stream: a failure after the stream
    started is one error event (500, InternalServerError), then the end."""
    res = call(_FailingClient(client), endpoint, {**body, "max_tokens": 20, "stream": True,
                                                  "temperature": 0, "ignore_eos": True})
    got = chunks(res)
    assert got[-1] == {"error": {"message": "the engine loop failed: RuntimeError: boom",
                                 "type": "InternalServerError", "param": None, "code": 500}}
    assert all("error" not in c for c in got[:-1]) and res.stream.get(0) == ""
    deadline = time.monotonic() + 30
    while client.num_unfinished() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client.num_unfinished() == 0


def test_cancel_frees_the_request(client):
    """A stream cancelled mid-way ends with finish_reason abort; no request is left."""
    # ignore_eos: the request cannot finish on its own before the cancel arrives
    res = call(client, "/v1/completions", {"prompt": "Tell me a story", "max_tokens": 200,
                                           "temperature": 0, "stream": True,
                                           "ignore_eos": True})
    assert res.stream.get(60)
    res.stream.cancel()
    rest = chunks(res)
    assert rest[-1]["choices"][0]["finish_reason"] == "abort"
    assert client.num_unfinished() == 0


# ---------------------------------------------------------------- logprobs shapes

needs_logprobs = pytest.mark.skipif(
    "logprobs" not in inspect.signature(SamplingParams).parameters,
    reason="waits for logprobs in SamplingParams (not built)")


@needs_logprobs
def test_completion_logprobs_end_to_end(client):
    """completion/test_completion.py::test_some_logprobs / test_too_many_completion_logprobs:
    one entry per generated token, logprobs + 1 top entries at most, offsets from 0."""
    body = ok(client, "/v1/completions", {"prompt": "Hello", "max_tokens": 4,
                                          "temperature": 0, "logprobs": 2})
    lp = body["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 4
    assert "".join(lp["tokens"]) == body["choices"][0]["text"] and lp["text_offset"][0] == 0
    assert all(1 <= len(top) <= 3 and max(top.values()) <= 0.0 for top in lp["top_logprobs"])
    got = chunks(call(client, "/v1/completions", {"prompt": "Hello", "max_tokens": 4,
                                                  "temperature": 0, "logprobs": 2,
                                                  "stream": True}))
    assert [t for c in got for t in c["choices"][0]["logprobs"]["tokens"]] == lp["tokens"]
    error = err(client, "/v1/completions", {"prompt": "Hello", "logprobs": 21})
    assert "Requested sample logprobs of 21, which is greater than max allowed: 20" \
        in error["message"]


def test_lagging_stream_reader_gets_merged_chunks(client):
    """A reader that falls behind the engine gets the steps in between merged into fewer
    chunks (vLLM's RequestOutputCollector): text, tokens and logprob offsets still add up
    to the non-streamed response."""
    req = {"prompt": "Hello", "max_tokens": 6, "temperature": 0, "logprobs": 1,
           "ignore_eos": True}
    lp = ok(client, "/v1/completions", req)["choices"][0]["logprobs"]
    res = call(client, "/v1/completions", {**req, "stream": True})
    deadline = time.monotonic() + 60
    while client.num_unfinished() and time.monotonic() < deadline:  # the reader lags
        time.sleep(0.01)
    got = [c for c in chunks(res) if c["choices"]]
    assert len(got) < len(lp["tokens"])
    merged = [c["choices"][0]["logprobs"] for c in got]
    assert [t for m in merged for t in m["tokens"]] == lp["tokens"]
    assert [o for m in merged for o in m["text_offset"]] == lp["text_offset"]
    assert got[-1]["choices"][0]["finish_reason"] == "length"


@needs_logprobs
def test_chat_logprobs_end_to_end(client):
    """chat_completion/test_chat.py::test_some_logprobs_chat: content[{token, logprob,
    bytes, top_logprobs}] with top_logprobs entries per token."""
    body = ok(client, "/v1/chat/completions", {"messages": HELLO, "max_tokens": 3,
                                               "temperature": 0, "logprobs": True,
                                               "top_logprobs": 2})
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == 3
    for entry in content:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        assert len(entry["top_logprobs"]) == 2 and entry["logprob"] <= 0.0
    body = ok(client, "/v1/chat/completions", {"messages": HELLO, "max_tokens": 2,
                                               "temperature": 0, "logprobs": True})
    assert all(e["top_logprobs"] == [] for e in body["choices"][0]["logprobs"]["content"])

class _LP:
    def __init__(self, logprob, decoded):
        self.logprob, self.decoded_token = logprob, decoded


@pytest.mark.parametrize("num, expected", [(-1, 3), (1, 2), (2, 3)])
def test_completion_logprobs_honors_requested_count(num, expected):
    """completion/test_completion_error.py::test_completion_logprobs_honors_requested_count."""
    step = {10: _LP(-0.1, "a"), 11: _LP(-0.2, "b"), 12: _LP(-0.3, "c")}
    lp = completion_logprobs([10], [step], num, lambda t: f"tok{t}")
    assert len(lp.top_logprobs[0]) == expected
    assert lp.tokens == ["a"] and lp.token_logprobs == [-0.1] and lp.text_offset == [0]


def test_logprobs_shapes():
    """OpenAI shapes: completions text_offset advances by token length; chat content entries
    carry bytes and top_logprobs; -inf is clamped to -9999.0 (vLLM)."""
    steps = [{5: _LP(-1.0, "He"), 6: _LP(float("-inf"), "X")}, {7: _LP(-0.5, "llo")}, None]
    lp = completion_logprobs([5, 7, 8], steps, 1, lambda t: "?", initial_text_offset=3)
    assert lp.text_offset == [3, 5, 8] and lp.tokens == ["He", "llo", "?"]
    assert lp.top_logprobs == [{"He": -1.0, "X": -9999.0}, {"llo": -0.5}, None]
    chat = chat_logprobs([5, 7], steps[:2], 1, lambda t: "?").model_dump()
    assert chat["content"][0] == {"token": "He", "logprob": -1.0, "bytes": [72, 101],
                                  "top_logprobs": [{"token": "He", "logprob": -1.0,
                                                    "bytes": [72, 101]}]}
