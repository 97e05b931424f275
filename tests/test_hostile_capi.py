"""Hostile input through the C ABI, libvllm.so loaded into this process:
items 6 and 7 with the issue's exact inputs, then a bounded property-based fuzz of the
argument space of include/vllm.h's engine, tokenizer, chat-template, request and OpenAI
functions: every call returns a documented status (never VLLM_ERR_INTERNAL, never a
crash) and the engine still serves afterwards.

vLLM's behaviour for item 7: a bad model path or chat template fails at start-up
(vllm/renderers/chat_utils/chat_template.py loads --chat-template when the server starts).
"""

from __future__ import annotations

import json
import os

import pytest
from test_capi_stream import PROMPT, looping_engine, open_library

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

pytestmark = [pytest.mark.capi, pytest.mark.slow]

api = pytest.fixture(scope="module")(open_library)
looping = pytest.fixture(scope="module")(looping_engine)
NUL_BODY = b'{"prompt":"a","max_tokens":1}\x00 junk'
ORDINARY = json.dumps({"model": "smol", "prompt": PROMPT, "max_tokens": 2,
                       "temperature": 0}).encode()
DEFER = 1  # VLLM_OPENAI_DEFER_RESPONSE


def _openai_len(api, engine, body: bytes | None, flags: int = 0, method=b"POST",
                endpoint=b"/v1/completions", size: int | None = None):
    """(vllm status, http status, response text, stream handle)."""
    ffi, lib = api.ffi, api.lib
    status, response, stream = ffi.new("int32_t *"), ffi.new("char **"), ffi.new(
        "vllm_openai_stream **")
    rc = lib.vllm_openai_request_len(engine, method, endpoint,
                                     ffi.NULL if body is None else body,
                                     len(body or b"") if size is None else size, flags,
                                     status, response, stream)
    text = None
    if response[0] != ffi.NULL:
        text = ffi.string(response[0]).decode()
        lib.vllm_string_free(response[0])
    return rc, status[0], text, stream[0]


def _serves(api, engine) -> None:
    rc, status, text, _ = _openai_len(api, engine, ORDINARY)
    assert (rc, status) == (0, 200), text
    assert json.loads(text)["usage"]["completion_tokens"] == 2


def _chunks(api, stream) -> list[str]:
    lib, ffi = api.lib, api.ffi
    chunk, out = ffi.new("char **"), []
    while (rc := lib.vllm_openai_stream_next(stream, 60_000, chunk)) == lib.VLLM_OK:
        out.append(ffi.string(chunk[0]).decode())
        lib.vllm_string_free(chunk[0])
    assert rc == lib.VLLM_END_OF_STREAM
    lib.vllm_openai_stream_free(stream)
    return out


def test_6_nul_byte_is_part_of_the_body(api, looping):
    engine, _ = looping
    rc, status, text, _ = _openai_len(api, engine, NUL_BODY)
    assert (rc, status) == (0, 400)
    error = json.loads(text)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == 400
    assert "json_invalid" in error["message"] and "trailing characters" in error["message"]
    _serves(api, engine)


def test_6_len_arguments(api, looping):
    engine, _ = looping
    lib = api.lib
    rc, *_ = _openai_len(api, engine, None, size=5)
    assert rc == lib.VLLM_ERR_INVALID_ARGUMENT and "body_size" in api.error()
    rc, *_ = _openai_len(api, engine, ORDINARY, flags=2)
    assert rc == lib.VLLM_ERR_INVALID_ARGUMENT and "flags" in api.error()
    rc, *_ = _openai_len(api, engine, b'{"prompt":"\xff"}')
    assert rc == lib.VLLM_ERR_INVALID_ARGUMENT and "UTF-8" in api.error()
    rc, status, text, _ = _openai_len(api, engine, None, method=b"GET", endpoint=b"/v1/models")
    assert (rc, status) == (0, 200) and json.loads(text)["data"][0]["id"] == "smol"
    _serves(api, engine)


def test_6_deferred_response_is_one_chunk(api, looping):
    engine, _ = looping
    rc, status, text, stream = _openai_len(api, engine, ORDINARY, flags=DEFER)
    assert (rc, status, text) == (0, 0, None) and stream != api.ffi.NULL
    (body,) = _chunks(api, stream)
    assert json.loads(body)["usage"]["completion_tokens"] == 2
    rc, status, text, stream = _openai_len(api, engine, NUL_BODY, flags=DEFER)
    assert (rc, status, stream) == (0, 400, api.ffi.NULL)  # refused before it runs: a body
    streamed = json.dumps({"prompt": PROMPT, "max_tokens": 2, "stream": True}).encode()
    rc, status, _, stream = _openai_len(api, engine, streamed, flags=DEFER)
    assert (rc, status) == (0, 200)
    assert _chunks(api, stream)[-1].startswith("{")  # SSE chunks as without the flag


def test_6_deferred_response_cancelled(api, looping):
    engine, _ = looping
    body = json.dumps({"prompt": PROMPT, "max_tokens": 200, "ignore_eos": True,
                       "temperature": 0}).encode()
    rc, status, _, stream = _openai_len(api, engine, body, flags=DEFER)
    assert (rc, status) == (0, 0)
    api.ok(api.lib.vllm_openai_stream_cancel(stream))
    (text,) = _chunks(api, stream)
    choice = json.loads(text)["choices"][0]
    assert choice["finish_reason"] == "abort" or len(choice["text"]) < 200
    _serves(api, engine)


def test_6_old_function_still_works(api, looping):
    engine, _ = looping
    ffi, lib = api.ffi, api.lib
    status, response, stream = ffi.new("int32_t *"), ffi.new("char **"), ffi.new(
        "vllm_openai_stream **")
    api.ok(lib.vllm_openai_request(engine, b"POST", b"/v1/completions", ORDINARY, status,
                                   response, stream))
    assert status[0] == 200
    assert json.loads(ffi.string(response[0]))["usage"]["completion_tokens"] == 2
    lib.vllm_string_free(response[0])


def test_7_dev_null_is_model_load(api):
    out = api.ffi.new("vllm_engine **")
    api.ok(api.lib.vllm_engine_create(b"/dev/null", api.ffi.NULL, out),
           api.lib.VLLM_ERR_MODEL_LOAD)
    assert out[0] == api.ffi.NULL and "/dev/null" in api.error()


def test_7_chat_template_syntax_error_fails_create(api, model_path):
    p, _keep = api.params(chat_template="{% for %}")
    out = api.ffi.new("vllm_engine **")
    api.ok(api.lib.vllm_engine_create(model_path.encode(), p, out),
           api.lib.VLLM_ERR_INVALID_ARGUMENT)
    assert out[0] == api.ffi.NULL and "chat template syntax error" in api.error()


@pytest.mark.parametrize("messages", [
    "[" * 10_000 + "]" * 10_000,  # the issue's: nested 10,000 deep
    '[{"role": "user", "content": ' + "[" * 10_000 + "]" * 10_000 + "}]",
    '[{"role": "user", "content": "hi", "x": ' + "[" * 900 + "]" * 900 + "}]",
])
def test_7_deep_messages_are_invalid_argument(api, looping, messages):
    engine, _ = looping
    out = api.ffi.new("char **")
    rc = api.lib.vllm_chat_template_apply(engine, messages.encode(), 1, out)
    assert rc in (api.lib.VLLM_ERR_INVALID_ARGUMENT, api.lib.VLLM_OK), api.error()
    if rc == api.lib.VLLM_OK:
        api.lib.vllm_string_free(out[0])
    else:
        assert "nested" in api.error() or "recursion" in api.error()
    _serves(api, engine)


# ----------------------------------------------------------------------- fuzz the ABI

_ints = st.one_of(st.integers(-3, 3), st.integers(-(2**31), 2**31 - 1))
_sizes = st.one_of(st.integers(0, 8), st.integers(0, 2**20))
_texts = st.one_of(st.binary(max_size=64), st.text(max_size=64).map(str.encode))
_json_texts = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["role", "content", "name", "type", "function", "x"]), inner,
        max_size=3), max_leaves=12).map(lambda v: json.dumps(v).encode())
_bodies = st.one_of(_texts, _json_texts, st.fixed_dictionaries({}, optional={
    "prompt": st.one_of(st.text(max_size=16), st.lists(st.integers(-5, 70000), max_size=4)),
    "messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "x"]),
                                                "content": st.text(max_size=8)}), max_size=2),
    "max_tokens": st.integers(-2, 3), "n": st.integers(-1, 2), "stream": st.booleans(),
    "temperature": st.floats(allow_nan=True), "logprobs": st.integers(-1, 3),
}).map(lambda d: json.dumps(d).encode()))
_calls = st.sampled_from(["tokenize", "detokenize", "piece", "apply", "render", "openai",
                          "submit", "info"])
_documented = {0, 1, 2, 4, 5, 6, 7, 10, 12}  # everything but MODEL_LOAD, RUNTIME_INIT, INTERNAL


def _call(api, engine, name, text, ints, size, body, flags):
    ffi, lib = api.ffi, api.lib
    n = ffi.new("size_t *")
    if name == "tokenize":
        buf = ffi.new("int32_t[]", max(size % 64, 1))
        return lib.vllm_tokenize(engine, text, len(text), ints[0], ints[-1], buf, size % 64, n)
    if name == "detokenize":
        ids = ffi.new("int32_t[]", ints)
        buf = ffi.new("char[]", max(size % 64, 1))
        return lib.vllm_detokenize(engine, ids, len(ints), ints[0], buf, size % 64, n)
    if name == "piece":
        buf = ffi.new("char[]", max(size % 16, 1))
        return lib.vllm_token_to_piece(engine, ints[0], ints[-1], buf, size % 16, n)
    if name in ("apply", "render"):
        out = ffi.new("char **")
        rc = lib.vllm_chat_template_apply(engine, body.replace(b"\0", b""), ints[0], out) \
            if name == "apply" else lib.vllm_chat_template_render(
                engine, body.replace(b"\0", b""), text.replace(b"\0", b""), ints[0], out)
        lib.vllm_string_free(out[0])
        return rc
    if name == "openai":
        rc, _, _, stream = _openai_len(api, engine, body, flags, method=b"POST",
                                       endpoint=[b"/v1/completions", b"/v1/chat/completions",
                                                 b"/tokenize", b"/x"][size % 4])
        if rc == 0 and stream != ffi.NULL:
            _chunks(api, stream)
        return rc
    if name == "submit":
        p = ffi.new("vllm_sampling_params *")
        lib.vllm_sampling_params_init(p, ffi.sizeof(p[0]))
        p.max_tokens, p.top_k, p.min_tokens = ints[0] % 4, ints[-1], ints[0]
        p.temperature, p.top_p = ints[-1] / 7, ints[0] / 3
        ids = ffi.new("int32_t[]", ints)
        out = ffi.new("vllm_request **")
        rc = lib.vllm_request_submit(engine, b"fuzz-%d" % size, ffi.NULL, ids, len(ints), p,
                                     ffi.NULL, ffi.NULL, out)
        if rc == 0:
            api.pull_all(out[0])
            lib.vllm_request_free(out[0])
        return rc
    info = ffi.new("vllm_model_info *")
    info.struct_size = size % 64
    return lib.vllm_engine_model_info(engine, info)


@settings(max_examples=120, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(name=_calls, text=_texts, ints=st.lists(_ints, min_size=1, max_size=4), size=_sizes,
       body=_bodies, flags=st.sampled_from([0, 1, 1, 3]))
def test_fuzz_abi_arguments(api, looping, name, text, ints, size, body, flags):
    engine, _ = looping
    rc = _call(api, engine, name, text, ints, size, body, flags)
    assert rc in _documented, (name, api.name(rc), api.error())


def test_fuzz_bad_handles(api, looping):
    """Handles that were never made or were freed: VLLM_ERR_INVALID_HANDLE, no crash."""
    ffi, lib = api.ffi, api.lib
    chunk, event = ffi.new("char **"), ffi.new("const vllm_event **")
    for value in (1, 2, 7, 2**31, 2**63 - 1, 0xDEADBEEF):
        handle = ffi.cast("void *", value)
        api.ok(lib.vllm_openai_stream_next(handle, 0, chunk), lib.VLLM_ERR_INVALID_HANDLE)
        api.ok(lib.vllm_request_next(handle, 0, event), lib.VLLM_ERR_INVALID_HANDLE)
        lib.vllm_openai_stream_free(handle)
        lib.vllm_request_free(handle)
    _serves(api, looping[0])


@pytest.mark.parametrize("path", ["/dev/zero", "/proc/self/fd/0", "/proc/self/mem", "/etc/passwd",
                                  "/", "", "/nonexistent\n", "fifo", "empty.gguf"])
def test_hostile_model_paths_are_model_load(api, tmp_path, path):
    if path == "fifo":
        path = str(tmp_path / "fifo")
        os.mkfifo(path)  # opening it would block: refused from its type
    elif path == "empty.gguf":
        path = str(tmp_path / path)
        open(path, "w").close()
    out = api.ffi.new("vllm_engine **")
    api.ok(api.lib.vllm_engine_create(path.encode(), api.ffi.NULL, out),
           api.lib.VLLM_ERR_MODEL_LOAD)
    assert out[0] == api.ffi.NULL


_param_ints = ["max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size",
               "enable_prefix_caching", "enable_chunked_prefill", "enforce_eager",
               "enable_auto_tool_choice", "skip_tokenizer_init", "async_scheduling"]
_param_strs = ["device", "dtype", "served_model_name", "chat_template", "tokenizer",
               "structured_outputs_backend", "reasoning_parser", "tool_call_parser",
               "load_format"]


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(ints=st.dictionaries(st.sampled_from(_param_ints), _ints, max_size=3),
       strs=st.dictionaries(st.sampled_from(_param_strs), st.text(
           st.characters(codec="utf-8", exclude_characters="\0"), max_size=12), max_size=2),
       struct_size=st.one_of(st.none(), st.integers(0, 2**32 - 1)),
       memory=st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
       utilization=st.one_of(st.none(), st.floats(width=32)))
def test_fuzz_engine_params(api, ints, strs, struct_size, memory, utilization):
    """Any vllm_engine_params with a missing model: refused (bad field or model load),
    never VLLM_ERR_INTERNAL; nothing is loaded."""
    p, keep = api.params(**ints, **strs)
    if struct_size is not None:
        p.struct_size = struct_size
    if memory is not None:
        p.kv_cache_memory_bytes = memory
    if utilization is not None:
        p.gpu_memory_utilization = utilization
    out = api.ffi.new("vllm_engine **")
    rc = api.lib.vllm_engine_create(b"/nonexistent/model.gguf", p, out)
    assert rc in (api.lib.VLLM_ERR_INVALID_ARGUMENT, api.lib.VLLM_ERR_MODEL_LOAD,
                  api.lib.VLLM_ERR_UNSUPPORTED), (api.name(rc), api.error())
    assert out[0] == api.ffi.NULL and keep is not None
