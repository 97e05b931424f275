"""examples/server end to end: the official `openai` client, unchanged, against the server
on the real default model, plus the HTTP-only duties of the server.

Checks: non-streaming and streaming chat and completions whose greedy text equals what the
C API returns for the same request (oracle: build/vllm-cli, a client of vllm.h); bad
requests get 4xx OpenAI error bodies and the server keeps serving; a client that
disconnects mid-stream frees its request (/metrics counts it aborted); default-deny API
key (401 OpenAI body; /health and /version public); the bounded admission queue (503 +
Retry-After, as vLLM's QueueOverflowError); /metrics Prometheus text with vLLM's names
(vllm/v1/metrics/loggers.py); SIGTERM drains in-flight streams; the server imports nothing
from engine/. Mirrors tests/entrypoints/openai/chat_completion/test_chat.py
(test_single_chat_session, test_chat_streaming), completion/test_completion.py
(test_single_completion, test_completion_streaming) and the auth cases of llama.cpp's
tools/server/tests/unit/test_security.py.
"""

from __future__ import annotations

import ast
import http.client
import json
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")

pytestmark = [pytest.mark.capi, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "examples" / "server"
KEY = "test-key-123"
MODEL = "smol"
MAX_MODEL_LEN = 512
PROMPT = "The capital of France is"
QUESTION = "What is the capital of France?"


def test_server_imports_nothing_from_engine():
    """The server is a client of vllm.h only: no module of it imports engine or capi."""
    for path in SERVER.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                assert name.split(".")[0] not in ("engine", "capi", "libvllm"), \
                    f"{path.name}: {name}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(built, model_path, child_env, tmp_path_factory, c_api):
    port = _free_port()
    log = (tmp_path_factory.mktemp("server") / "server.log").open("w+")
    proc = subprocess.Popen(
        [sys.executable, str(SERVER / "server.py"), model_path, "--port", str(port),
         "--api-key", KEY, "--served-model-name", MODEL, "--max-model-len", str(MAX_MODEL_LEN),
         "--max-num-seqs", "8", "--max-num-queued-reqs", "2", "--shutdown-timeout", "60",
         "--tool-call-parser", "hermes", "--enable-auto-tool-choice",
         "--lib", str(built / "libvllm.so"), "--uvicorn-log-level", "warning"],
        stdout=log, stderr=subprocess.STDOUT, env=child_env)
    yield from serving(proc, port, log)


def serving(proc: subprocess.Popen, port: int, log):
    """A fixture's body for a started server: (proc, port) once /health answers 200
    (the log in the failure otherwise), then SIGINT (kill after 30 s)."""
    deadline = time.monotonic() + 300  # the oracle loads the model at the same time
    while _status(port, "GET", "/health")[0] != 200:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            log.seek(0)
            pytest.fail(f"server did not become healthy:\n{log.read()}")
        time.sleep(0.3)
    yield proc, port
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _status(port, method, path, body=None, headers=None):
    """(status, headers, body) of one raw request; (0, {}, "") if nothing listens."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        res = conn.getresponse()
        return res.status, dict(res.getheaders()), res.read().decode()
    except OSError:
        return 0, {}, ""
    finally:
        conn.close()


def _auth(extra=None):
    return {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json", **(extra or {})}


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server[1]}/v1", api_key=KEY,
                         max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def c_api(built, model_path, child_env):
    """The oracle: build/vllm-cli's greedy answers (generate: raw prompt; chat: template),
    started before the server so that the model loads overlap."""
    runs = {command: subprocess.Popen(
        [str(built / "vllm-cli"), command, "-m", model_path, "-p", prompt, "-n", str(n),
         "--temp", "0", "--max-model-len", str(MAX_MODEL_LEN)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env)
        for command, prompt, n in (("generate", PROMPT, 8), ("chat", QUESTION, 12))}

    def answer(command: str) -> str:
        out, err = runs[command].communicate(timeout=300)
        assert runs[command].returncode == 0, err
        assert out.endswith("\n")
        return out[:-1]
    yield answer
    for run in runs.values():  # not waited for when only some tests ran
        if run.poll() is None:
            run.kill()
        run.communicate()


def test_completions_match_c_api(client, c_api):
    expected = c_api("generate")
    res = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0)
    assert res.object == "text_completion" and res.model == MODEL
    assert res.choices[0].text == expected and res.choices[0].finish_reason == "length"
    assert res.usage.completion_tokens == 8
    stream = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0,
                                       stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected
    assert chunks[-1].usage.completion_tokens == 8


def test_chat_matches_c_api(client, c_api):
    expected = c_api("chat")
    messages = [{"role": "user", "content": QUESTION}]
    res = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12,
                                         temperature=0)
    assert res.object == "chat.completion"
    assert res.choices[0].message.role == "assistant"
    assert res.choices[0].message.content == expected
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12,
                                            temperature=0, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")


def test_models_and_public_paths(server, client):
    port = server[1]
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert _status(port, "GET", "/health")[0] == 200
    status, _, body = _status(port, "GET", "/version")
    assert status == 200 and json.loads(body)["version"]


@pytest.mark.parametrize("path, headers", [
    ("/v1/models", {}),
    ("/v1/models", {"Authorization": "Bearer wrong"}),
    ("/metrics", {}),
    ("/tokenize", {"Authorization": KEY}),  # no Bearer scheme
])
def test_api_key_required(server, path, headers):
    status, res_headers, body = _status(server[1], "GET", path, headers=headers)
    assert status == 401 and res_headers.get("www-authenticate") == "Bearer"
    assert json.loads(body)["error"]["type"] == "authentication_error"
    assert _status(server[1], "GET", "/v1/models", headers={"X-Api-Key": KEY})[0] == 200


def test_bad_requests_keep_serving(server, client):
    messages = [{"role": "user", "content": "Hi"}]
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="gpt-4", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="maximum context length is 512"):
        client.completions.create(model=MODEL, prompt="hello " * 600, max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="max_tokens must be at least 1"):
        client.completions.create(model=MODEL, prompt="x", max_tokens=-3)
    with pytest.raises(openai.BadRequestError, match="n must be at most 16384"):
        client.chat.completions.create(model=MODEL, messages=messages, n=20000, temperature=1)
    with pytest.raises(openai.BadRequestError, match="does not match any of the specified"):
        client.chat.completions.create(model=MODEL, messages=messages, tools=[
            {"type": "function", "function": {"name": "f", "parameters": {}}}],
            tool_choice={"type": "function", "function": {"name": "g"}})
    status, _, body = _status(server[1], "POST", "/v1/chat/completions", body="{not json",
                              headers=_auth())
    assert status == 400 and set(json.loads(body)["error"]) == {"message", "type", "param",
                                                                 "code"}
    status, _, body = _status(server[1], "POST", "/v1/completions", body='{"prompt": "x"}',
                              headers=_auth({"Content-Type": "text/plain"}))
    assert status == 400 and "Only 'application/json' is allowed" in body
    res = client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, temperature=0)
    assert res.usage.completion_tokens == 2


def _metrics(port) -> dict[str, float]:
    status, _, text = _status(port, "GET", "/metrics", headers=_auth())
    assert status == 200
    return {m[1]: float(m[2]) for m in re.finditer(r"^(vllm:\S+) (\S+)$", text, re.M)}


def _open_stream(port, max_tokens):
    """A raw streaming completion, read up to its first event; returns the connection.
    Retries while the server is busy with the cancelled streams of earlier tests."""
    body = json.dumps({"model": MODEL, "prompt": "Tell me a long story.", "stream": True,
                       "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True})
    deadline = time.monotonic() + 30
    while True:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("POST", "/v1/completions", body=body, headers=_auth())
        res = conn.getresponse()
        if res.status != 503 or time.monotonic() > deadline:
            break
        conn.close()
        time.sleep(0.3)
    assert res.status == 200 and res.getheader("content-type").startswith("text/event-stream")
    assert res.readline().startswith(b"data: {")
    return conn, res


# strict: the hermes parser's structural tags pin a call's arguments for strict tools only
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                   "required": ["city"], "additionalProperties": False}}}


def test_openai_client_tool_call_loop(server, client):
    """The official client's tool loop (tool_choice required through the hermes server),
    then the same call streamed: id and name once, arguments that concatenate to JSON."""
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL],
                                           tool_choice="required", temperature=0, max_tokens=120)
    choice = first.choices[0]
    (call,) = choice.message.tool_calls
    assert choice.finish_reason == "tool_calls" and call.function.name == "get_weather"
    assert set(json.loads(call.function.arguments)) == {"city"}
    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 21}'})
    final = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL],
                                           tool_choice="none", temperature=0, max_tokens=16)
    assert final.choices[0].message.content and not final.choices[0].message.tool_calls

    ids, names, args = set(), [], ""
    for chunk in client.chat.completions.create(
            model=MODEL, messages=messages[:1], tools=[WEATHER_TOOL], tool_choice="required",
            temperature=0, max_tokens=120, stream=True):
        for delta in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            assert delta.index == 0
            ids |= {delta.id} if delta.id else set()
            names += [delta.function.name] if delta.function.name else []
            args += delta.function.arguments or ""
        finish = chunk.choices[0].finish_reason if chunk.choices else None
    assert len(ids) == 1 and names == ["get_weather"] and finish == "tool_calls"
    assert json.loads(args) == json.loads(call.function.arguments)


def test_metrics_text(server, client):
    status, headers, text = _status(server[1], "GET", "/metrics", headers=_auth())
    assert status == 200 and headers["content-type"].startswith("text/plain")
    labels = f'{{engine="0",model_name="{MODEL}"}}'
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
        assert f"# TYPE vllm:{name} gauge" in text and f"vllm:{name}{labels} " in text
    for name in ("prefix_cache_queries", "prefix_cache_hits", "num_preemptions",
                 "prompt_tokens", "generation_tokens"):
        assert f"# TYPE vllm:{name}_total counter" in text
    for reason in ("stop", "length", "abort", "error"):
        assert f'finished_reason="{reason}"' in text
    before = _metrics(server[1])
    client.completions.create(model=MODEL, prompt="Hi", max_tokens=3, temperature=0)
    after = _metrics(server[1])
    key = f"vllm:generation_tokens_total{labels}"
    assert after[key] == before[key] + 3


def test_disconnect_mid_stream_aborts(server):
    port = server[1]
    aborted = 'vllm:request_success_total{engine="0",model_name="smol",finished_reason="abort"}'
    running = 'vllm:num_requests_running{engine="0",model_name="smol"}'
    before = _metrics(port)[aborted]
    conn, _ = _open_stream(port, 400)
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    deadline = time.monotonic() + 20
    while True:
        now = _metrics(port)
        if now[aborted] == before + 1 and now[running] == 0:
            break
        assert time.monotonic() < deadline, f"the request was not aborted: {now}"
        time.sleep(0.2)


def test_admission_queue_is_bounded(server):
    """--max-num-queued-reqs 2: a third concurrent request gets 503 with Retry-After."""
    port = server[1]
    streams = [_open_stream(port, 400) for _ in range(2)]
    try:
        status, headers, body = _status(port, "POST", "/v1/completions", headers=_auth(),
                                        body=json.dumps({"model": MODEL, "prompt": "x"}))
        assert status == 503 and headers.get("retry-after") == "1"
        assert "currently busy" in json.loads(body)["error"]["message"]
    finally:
        for conn, _ in streams:
            conn.close()


def test_sigterm_drains(server):
    """SIGTERM with --shutdown-timeout: /health and new requests get 503 while the
    in-flight stream runs to its end; then the process exits 0. Runs last."""
    proc, port = server
    conn, res = _open_stream(port, 8)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert _status(port, "GET", "/health")[0] == 503
    status, headers, _ = _status(port, "POST", "/v1/completions", headers=_auth(),
                                 body=json.dumps({"model": MODEL, "prompt": "x"}))
    assert status == 503 and headers.get("retry-after") == "1"
    events = [line for line in res.read().decode().split("\n\n") if line]
    conn.close()
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2][len("data: "):])["choices"][0]["finish_reason"] == "length"
    assert proc.wait(60) == 0
