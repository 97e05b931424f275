"""ABI 0.2 of include/vllm.h, driven through build/libvllm.so loaded into this Python
process (cffi ABI mode, as a ctypes host would): the background loop with pull and push
streaming, cancel, mixing the two modes (VLLM_ERR_INVALID_STATE), an engine failure as a
last event, metrics, token_to_piece, chat template with tools, the log and load-progress
callbacks, served_model_name and chat_template overrides, and v0.1-sized params structs.
tests/test_capi_openai.py reuses its helpers (Api, the api and looping fixtures).

Oracles: the caller-driven vllm_engine_step greedy text on the same engine (for the
streamed text), the engine's Python tokenizer (pieces), engine.chat_template (rendering
with tools), and the documented contract in vllm.h (statuses, one terminal event).
Mirrors the streaming/abort checks of vLLM 0.33 tests/v1/engine/test_async_llm.py and
tests/v1/engine/test_llm_engine.py at the C boundary.
"""

from __future__ import annotations

import json
import logging
import threading
import time

import cffi
import pytest

from libvllm.capi.header import api_cdef

pytestmark = [pytest.mark.capi, pytest.mark.slow]

PROMPT = "The capital of France is"
MESSAGES = '[{"role": "user", "content": "What is the capital of France?"}]'
TOOLS = ('[{"type": "function", "function": {"name": "get_weather", "description": '
         '"Weather of a city", "parameters": {"type": "object", "properties": '
         '{"city": {"type": "string"}}}}}]')


class Api:
    """The library in this process: ffi, lib and small helpers."""

    def __init__(self, ffi, lib):
        self.ffi, self.lib = ffi, lib

    def ok(self, status, want=None):
        want = self.lib.VLLM_OK if want is None else want
        assert status == want, (self.name(status), self.error())

    def name(self, status) -> str:
        return self.ffi.string(self.lib.vllm_status_string(status)).decode()

    def error(self) -> str:
        return self.ffi.string(self.lib.vllm_last_error()).decode()

    def greedy(self, max_tokens: int):
        sp = self.ffi.new("vllm_sampling_params *")
        self.lib.vllm_sampling_params_init(sp, self.ffi.sizeof(sp[0]))
        sp.temperature, sp.max_tokens, sp.ignore_eos = 0.0, max_tokens, 1
        return sp

    def params(self, **fields):
        p = self.ffi.new("vllm_engine_params *")
        self.lib.vllm_engine_params_init(p, self.ffi.sizeof(p[0]))
        p.max_model_len = 256
        keep = []
        for name, value in fields.items():
            if isinstance(value, str):
                value = self.ffi.new("char[]", value.encode())
                keep.append(value)
            setattr(p, name, value)
        return p, keep

    def create(self, model_path: str, **fields):
        p, _keep = self.params(**fields)
        out = self.ffi.new("vllm_engine **")
        self.ok(self.lib.vllm_engine_create(model_path.encode(), p, out))
        return out[0]

    def submit(self, engine, rid: str, sp, prompt: str = PROMPT, callback=None, user_data=None):
        out = self.ffi.new("vllm_request **")
        self.ok(self.lib.vllm_request_submit(
            engine, rid.encode(), prompt.encode(), self.ffi.NULL, 0, sp,
            callback or self.ffi.NULL, user_data or self.ffi.NULL, out))
        return out[0]

    def pull_all(self, request, cancel_after: int | None = None) -> list[dict]:
        events, n_tokens = [], 0
        event = self.ffi.new("const vllm_event **")
        while True:
            status = self.lib.vllm_request_next(request, 60000, event)
            if status == self.lib.VLLM_END_OF_STREAM:
                return events
            self.ok(status)
            events.append(self.event_dict(event[0]))
            n_tokens += events[-1]["n_token_ids"]
            if cancel_after is not None and n_tokens >= cancel_after:
                self.ok(self.lib.vllm_request_cancel(request))

    def event_dict(self, ev) -> dict:
        ffi = self.ffi
        return {
            "struct_size": ev.struct_size,
            "request_id": ffi.string(ev.request_id).decode(),
            "tokens": list(ev.token_ids[0:ev.n_token_ids]) if ev.n_token_ids else [],
            "n_token_ids": ev.n_token_ids,
            "text": ffi.string(ev.text).decode(),
            "finished": ev.finished,
            "finish_reason": ev.finish_reason,
            "num_prompt_tokens": ev.num_prompt_tokens,
            "num_output_tokens": ev.num_output_tokens,
            "status": ev.status,
            "error": ffi.string(ev.error).decode(),
        }

    def step_text(self, engine, rid: str, sp) -> str:
        lib, ffi = self.lib, self.ffi
        self.ok(lib.vllm_request_add(engine, rid.encode(), PROMPT.encode(), ffi.NULL, 0, sp))
        outs, n, left = ffi.new("vllm_request_output **"), ffi.new("size_t *"), ffi.new(
            "size_t *", 1)
        text = ""
        while left[0]:
            self.ok(lib.vllm_engine_step(engine, outs, n))
            text += "".join(ffi.string(outs[0][i].text).decode() for i in range(n[0]))
            self.ok(lib.vllm_engine_num_unfinished(engine, left))
        return text


def open_library(built):
    """The library loaded into this process (the api fixture); shut down afterwards."""
    ffi = cffi.FFI()
    ffi.cdef(api_cdef())
    lib = ffi.dlopen(str(built / "libvllm.so"))
    yield Api(ffi, lib)
    lib.vllm_shutdown()


def looping_engine(api, model_path):
    """(engine, greedy text of 12 tokens by vllm_engine_step) for the looping fixture:
    caller-driven first, then switched to the background loop."""
    lib, ffi = api.lib, api.ffi
    engine = api.create(model_path, served_model_name="smol")
    oracle = api.step_text(engine, "oracle", api.greedy(12))
    api.ok(lib.vllm_request_add(engine, b"pending", PROMPT.encode(), ffi.NULL, 0, api.greedy(4)))
    api.ok(lib.vllm_engine_start_loop(engine), lib.VLLM_ERR_INVALID_STATE)
    assert "unfinished" in api.error()
    api.ok(lib.vllm_request_abort(engine, b"pending"))
    api.step_text(engine, "drain", api.greedy(1))
    api.ok(lib.vllm_engine_start_loop(engine))
    api.ok(lib.vllm_engine_start_loop(engine))  # twice: fine
    yield engine, oracle
    lib.vllm_engine_free(engine)


api = pytest.fixture(scope="module")(open_library)
looping = pytest.fixture(scope="module")(looping_engine)


def test_pull_stream_equals_caller_driven_greedy(api, looping):
    engine, oracle = looping
    request = api.submit(engine, "pull", api.greedy(12))
    events = api.pull_all(request)
    assert "".join(e["text"] for e in events) == oracle
    assert [e["finished"] for e in events].count(1) == 1 and events[-1]["finished"]
    assert events[-1]["finish_reason"] == api.lib.VLLM_FINISH_LENGTH
    assert events[-1]["num_output_tokens"] == sum(e["n_token_ids"] for e in events) == 12
    assert events[-1]["struct_size"] == api.ffi.sizeof("vllm_event")
    assert all(e["request_id"] == "pull" and e["status"] == 0 for e in events)
    event = api.ffi.new("const vllm_event **")
    api.ok(api.lib.vllm_request_next(request, 0, event), api.lib.VLLM_END_OF_STREAM)
    assert event[0] == api.ffi.NULL
    api.lib.vllm_request_free(request)
    api.ok(api.lib.vllm_request_next(request, 0, event), api.lib.VLLM_ERR_INVALID_HANDLE)
    api.lib.vllm_request_free(request)  # twice: a no-op


def test_timeout_then_cancel(api, looping):
    engine, _ = looping
    lib, ffi = api.lib, api.ffi
    request = api.submit(engine, "slow", api.greedy(200))
    event = ffi.new("const vllm_event **")
    api.ok(lib.vllm_request_next(request, 0, event), lib.VLLM_ERR_TIMEOUT)
    api.ok(lib.vllm_request_cancel(request))
    events = api.pull_all(request)
    assert events[-1]["finish_reason"] == lib.VLLM_FINISH_ABORT
    api.ok(lib.vllm_request_cancel(request))  # finished: still OK
    lib.vllm_request_free(request)


def test_push_callback_runs_on_the_loop_thread_with_one_terminal_event(api, looping):
    engine, oracle = looping
    seen, done = [], threading.Event()

    @api.ffi.callback("void(const vllm_event *, void *)")
    def on_event(ev, user_data):
        seen.append((threading.current_thread().name, api.event_dict(ev),
                     int(api.ffi.cast("intptr_t", user_data))))
        if ev.finished:
            done.set()

    request = api.submit(engine, "push", api.greedy(12), callback=on_event,
                         user_data=api.ffi.cast("void *", 42))
    assert done.wait(120)
    time.sleep(0.1)
    assert {(name, ud) for name, _, ud in seen} == {("vllm-engine-loop", 42)}
    assert "".join(e["text"] for _, e, _ in seen) == oracle
    assert [e["finished"] for _, e, _ in seen].count(1) == 1
    event = api.ffi.new("const vllm_event **")
    api.ok(api.lib.vllm_request_next(request, 0, event), api.lib.VLLM_ERR_INVALID_STATE)
    api.lib.vllm_request_free(request)


def test_push_without_handle_and_abort_by_id(api, looping):
    engine, _ = looping
    lib, ffi = api.lib, api.ffi
    events, done = [], threading.Event()

    @ffi.callback("void(const vllm_event *, void *)")
    def on_event(ev, user_data):
        events.append(api.event_dict(ev))
        if ev.finished:
            done.set()

    api.ok(lib.vllm_request_submit(engine, b"by-id", PROMPT.encode(), ffi.NULL, 0,
                                   api.greedy(500), on_event, ffi.NULL, ffi.NULL))
    while not events:
        time.sleep(0.01)
    api.ok(lib.vllm_request_abort(engine, b"by-id"))
    assert done.wait(60)
    assert events[-1]["finish_reason"] == lib.VLLM_FINISH_ABORT
    api.ok(lib.vllm_request_abort(engine, b"by-id"), lib.VLLM_ERR_NOT_FOUND)
    api.ok(lib.vllm_request_submit(engine, b"x", PROMPT.encode(), ffi.NULL, 0, ffi.NULL,
                                   ffi.NULL, ffi.NULL, ffi.NULL), lib.VLLM_ERR_INVALID_ARGUMENT)


def test_mixing_modes_is_invalid_state(api, looping):
    engine, _ = looping
    lib, ffi = api.lib, api.ffi
    outs, n = ffi.new("vllm_request_output **"), ffi.new("size_t *")
    api.ok(lib.vllm_engine_step(engine, outs, n), lib.VLLM_ERR_INVALID_STATE)
    assert "background loop" in api.error()
    api.ok(lib.vllm_request_add(engine, b"r", b"hi", ffi.NULL, 0, ffi.NULL),
           lib.VLLM_ERR_INVALID_STATE)


def test_invalid_input_fails_the_submit(api, looping):
    engine, _ = looping
    lib, ffi = api.lib, api.ffi
    sp = api.greedy(4)
    sp.temperature = 5.0
    out = ffi.new("vllm_request **")
    api.ok(lib.vllm_request_submit(engine, b"bad", b"hi", ffi.NULL, 0, sp, ffi.NULL, ffi.NULL,
                                   out), lib.VLLM_ERR_INVALID_ARGUMENT)
    assert api.error() == "temperature must be in [0, 2], got 5.0." and out[0] == ffi.NULL
    api.ok(lib.vllm_request_submit(engine, b"empty", ffi.NULL, ffi.new("int32_t[1]"), 0, sp,
                                   ffi.NULL, ffi.NULL, out), lib.VLLM_ERR_INVALID_ARGUMENT)


def test_submit_needs_the_loop(api, model_path):
    engine = api.create(model_path)
    lib, ffi = api.lib, api.ffi
    out = ffi.new("vllm_request **")
    api.ok(lib.vllm_request_submit(engine, b"r", b"hi", ffi.NULL, 0, ffi.NULL, ffi.NULL,
                                   ffi.NULL, out), lib.VLLM_ERR_INVALID_STATE)
    assert "vllm_engine_start_loop" in api.error()
    status, body, stream = ffi.new("int32_t *"), ffi.new("char **"), ffi.new(
        "vllm_openai_stream **")
    api.ok(lib.vllm_openai_request(engine, b"GET", b"/v1/models", ffi.NULL, status, body,
                                   stream), lib.VLLM_ERR_INVALID_STATE)
    lib.vllm_engine_free(engine)


def test_engine_failure_is_a_last_error_event(api, model_path, monkeypatch):
    import libvllm.engine.llm_engine

    lib = api.lib
    engine_handle = api.create(model_path)
    api.ok(lib.vllm_engine_start_loop(engine_handle))

    def broken_step(self):
        raise RuntimeError("boom")

    monkeypatch.setattr(libvllm.engine.llm_engine.LLMEngine, "step", broken_step)
    request = api.submit(engine_handle, "doomed", api.greedy(4))
    events = api.pull_all(request)
    assert len(events) == 1 and events[0]["finished"]
    assert events[0]["finish_reason"] == lib.VLLM_FINISH_ERROR
    assert events[0]["status"] == lib.VLLM_ERR_INTERNAL
    assert events[0]["error"] == "the engine loop failed: RuntimeError: boom"
    out = api.ffi.new("vllm_request **")
    api.ok(lib.vllm_request_submit(engine_handle, b"later", b"hi", api.ffi.NULL, 0, api.ffi.NULL,
                                   api.ffi.NULL, api.ffi.NULL, out), lib.VLLM_ERR_INTERNAL)
    monkeypatch.undo()
    lib.vllm_request_free(request)
    lib.vllm_engine_free(engine_handle)


def test_freeing_the_engine_ends_its_streams(api, model_path):
    lib = api.lib
    engine_handle = api.create(model_path)
    api.ok(lib.vllm_engine_start_loop(engine_handle))
    request = api.submit(engine_handle, "orphan", api.greedy(1000))
    lib.vllm_engine_free(engine_handle)
    events = api.pull_all(request)
    assert events[-1]["finish_reason"] == lib.VLLM_FINISH_ABORT
    lib.vllm_request_free(request)


# --------------------------------------------------------------------------- typed core


def test_metrics_count_requests(api, looping):
    engine, _ = looping
    lib, ffi = api.lib, api.ffi
    m = ffi.new("vllm_metrics *")
    m.struct_size = ffi.sizeof("vllm_metrics")
    api.ok(lib.vllm_engine_metrics(engine, m))
    before = m.request_success_length
    api.pull_all(api.submit(engine, "counted", api.greedy(3)))
    api.ok(lib.vllm_engine_metrics(engine, m))
    assert m.request_success_length == before + 1
    assert m.generation_tokens >= 3 and m.prompt_tokens > 0
    assert m.num_requests_running == m.num_requests_waiting == 0
    assert 0.0 <= m.kv_cache_usage_perc <= 1.0
    assert m.struct_size == ffi.sizeof("vllm_metrics")
    m.struct_size = 8
    api.ok(lib.vllm_engine_metrics(engine, m), lib.VLLM_ERR_INVALID_ARGUMENT)


def test_token_to_piece_concatenates_to_the_text(api, looping):
    engine, _ = looping
    lib, ffi = api.lib, api.ffi
    text = "Héllo, wörld! 日本"
    ids, n = ffi.new("int32_t[64]"), ffi.new("size_t *")
    api.ok(lib.vllm_tokenize(engine, text.encode(), len(text.encode()), 0, 1, ids, 64, n))
    pieces = b""
    for token in ids[0:n[0]]:
        size = ffi.new("size_t *")
        api.ok(lib.vllm_token_to_piece(engine, token, 0, ffi.NULL, 0, size),
               lib.VLLM_ERR_BUFFER_TOO_SMALL)
        buf = ffi.new("char[]", size[0] + 1)
        api.ok(lib.vllm_token_to_piece(engine, token, 0, buf, size[0] + 1, size))
        pieces += ffi.buffer(buf, size[0])[:]
    assert pieces.decode() == text
    info = ffi.new("vllm_model_info *")
    info.struct_size = ffi.sizeof("vllm_model_info")
    api.ok(lib.vllm_engine_model_info(engine, info))
    buf, size = ffi.new("char[64]"), ffi.new("size_t *")
    api.ok(lib.vllm_token_to_piece(engine, info.eos_token_id, 0, buf, 64, size))
    assert size[0] == 0
    api.ok(lib.vllm_token_to_piece(engine, info.eos_token_id, 1, buf, 64, size))
    assert ffi.string(buf).decode() == "<|im_end|>"
    api.ok(lib.vllm_token_to_piece(engine, info.vocab_size, 1, buf, 64, size),
           lib.VLLM_ERR_INVALID_ARGUMENT)


def test_chat_template_render_with_tools(api, looping, model_path):
    from libvllm.engine.chat_template import render_chat_template

    engine, _ = looping
    lib, ffi = api.lib, api.ffi
    template = ("{% for t in tools %}TOOL:{{ t.function.name }};{% endfor %}"
                "{% for m in messages %}{{ m.role }}:{{ m.content }}{% endfor %}")
    engine_with_template = api.create(model_path, chat_template=template)
    out = ffi.new("char **")
    api.ok(lib.vllm_chat_template_render(engine_with_template, MESSAGES.encode(),
                                         TOOLS.encode(), 1, out))
    rendered = ffi.string(out[0]).decode()
    lib.vllm_string_free(out[0])
    assert rendered == render_chat_template(template, json.loads(MESSAGES),
                                            tools=json.loads(TOOLS))
    assert rendered.startswith("TOOL:get_weather;user:")
    api.ok(lib.vllm_chat_template_render(engine_with_template, MESSAGES.encode(), b"{}", 1,
                                         out), lib.VLLM_ERR_INVALID_ARGUMENT)
    api.ok(lib.vllm_chat_template_render(engine, MESSAGES.encode(), ffi.NULL, 1, out))
    lib.vllm_string_free(out[0])
    lib.vllm_engine_free(engine_with_template)


def test_chat_template_path_must_exist(api, model_path, tmp_path):
    lib, ffi = api.lib, api.ffi
    p, _keep = api.params(chat_template=str(tmp_path / "missing.jinja"))
    out = ffi.new("vllm_engine **")
    api.ok(lib.vllm_engine_create(model_path.encode(), p, out), lib.VLLM_ERR_INVALID_ARGUMENT)
    assert api.error().startswith("The supplied chat template (")
    (tmp_path / "t.jinja").write_text("{{ messages[0].content }}!")
    engine = api.create(model_path, chat_template=str(tmp_path / "t.jinja"),
                        served_model_name="custom")
    rendered = ffi.new("char **")
    api.ok(lib.vllm_chat_template_apply(engine, MESSAGES.encode(), 1, rendered))
    assert ffi.string(rendered[0]).decode() == "What is the capital of France?!"
    lib.vllm_string_free(rendered[0])
    info = ffi.new("vllm_model_info *")
    info.struct_size = ffi.sizeof("vllm_model_info")
    api.ok(lib.vllm_engine_model_info(engine, info))
    assert ffi.string(info.name) == b"custom"
    lib.vllm_engine_free(engine)


def test_progress_callback_reports_zero_to_one(api, model_path):
    seen = []

    @api.ffi.callback("int32_t(float, void *)")
    def on_progress(fraction, user_data):
        seen.append(fraction)
        return 1

    engine = api.create(model_path, progress_callback=on_progress)
    assert seen[0] == 0.0 and seen[-1] == 1.0 and seen.count(1.0) == 1
    assert seen == sorted(seen)
    api.lib.vllm_engine_free(engine)


def test_log_callback_receives_engine_logs(api, looping):
    lib, ffi = api.lib, api.ffi
    seen = []

    @ffi.callback("void(int32_t, const char *, void *)")
    def on_log(level, message, user_data):
        seen.append((level, ffi.string(message).decode()))

    lib.vllm_log_set(lib.VLLM_LOG_INFO, on_log, ffi.NULL)
    try:
        logging.getLogger("libvllm.engine.test").info("hello from the engine")
        logging.getLogger("libvllm.engine.test").debug("too detailed")
    finally:
        lib.vllm_log_set(lib.VLLM_LOG_WARNING, ffi.NULL, ffi.NULL)
    logging.getLogger("libvllm.engine.test").warning("after reset")
    assert seen == [(lib.VLLM_LOG_INFO, "hello from the engine")]
    assert logging.getLogger("libvllm.engine").propagate


def test_v0_1_sized_engine_params_are_accepted(api, model_path):
    lib, ffi = api.lib, api.ffi
    p, _ = api.params()
    p.struct_size = ffi.offsetof("vllm_engine_params", "served_model_name")
    p.served_model_name = ffi.cast("const char *", 1)  # beyond the caller's struct: unread
    out = ffi.new("vllm_engine **")
    api.ok(lib.vllm_engine_create(model_path.encode(), p, out))
    lib.vllm_engine_free(out[0])
    p.struct_size = ffi.offsetof("vllm_engine_params", "served_model_name") - 4
    api.ok(lib.vllm_engine_create(model_path.encode(), p, out), lib.VLLM_ERR_INVALID_ARGUMENT)
