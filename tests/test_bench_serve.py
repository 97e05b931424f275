"""`python -m examples.bench serve` against a scripted OpenAI-style SSE server on localhost:
the request body is vLLM's openai backend's (vllm/benchmarks/lib/endpoint_request_func.py),
TTFT/ITL/TPOT come from chunk arrival times, output tokens from usage, --max-concurrency
caps the requests in flight, a failing request is counted as failed, and the result block
and JSON are written. The server sends each of N_TOKENS text chunks GAP seconds apart
(chunked transfer encoding, as uvicorn's StreamingResponse), then a usage chunk and
[DONE]."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from examples.bench.__main__ import main

N_TOKENS, GAP, FIRST = 4, 0.03, 0.05


class FakeServer:
    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.in_flight = self.max_in_flight = 0
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = self.server.sockets[0].getsockname()[1]
        self.ready.set()
        self.loop.run_forever()

    async def _handle(self, reader, writer) -> None:
        request_line = (await reader.readline()).decode()
        headers = {}
        while (line := (await reader.readline()).decode().strip()):
            k, _, v = line.partition(":")
            headers[k.lower()] = v.strip()
        body = await reader.readexactly(int(headers.get("content-length", 0)))
        if request_line.startswith("GET /v1/models"):
            data = json.dumps({"data": [{"id": "fake-model", "root": "fake"}]}).encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
        else:
            payload = json.loads(body)
            self.bodies.append(payload)
            if payload["prompt"][0] == 9999:  # the scripted failure
                writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 2\r\n\r\n{}")
            else:
                await self._stream(writer, payload["max_tokens"])
        await writer.drain()
        writer.close()

    async def _stream(self, writer, max_tokens: int) -> None:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")

        def send(obj, prefix: bytes = b"data: ") -> None:
            data = prefix + (obj if isinstance(obj, bytes) else json.dumps(obj).encode())
            data += b"\n\n"
            writer.write(b"%x\r\n%s\r\n" % (len(data), data))

        await asyncio.sleep(FIRST)
        send(b": keep-alive comment", prefix=b"")  # skipped by the client, as vLLM's
        for i in range(N_TOKENS):
            if i:
                await asyncio.sleep(GAP)
            send({"choices": [{"index": 0, "text": f"t{i} "}]})
            await writer.drain()
        send({"choices": [], "usage": {"completion_tokens": N_TOKENS, "prompt_tokens": 8}})
        send(b"[DONE]")
        writer.write(b"0\r\n\r\n")
        self.in_flight -= 1

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture
def server():
    s = FakeServer()
    yield s
    s.close()


def test_serve_against_streaming_server(server, tmp_path, capsys):
    out = tmp_path / "serve.json"
    res = main(["serve", "--port", str(server.port), "--num-prompts", "6", "--input-len", "8",
                "--output-len", "4", "--max-concurrency", "2", "--ignore-eos",
                "--metric-percentiles", "50,99", "--output-json", str(out)])
    text = capsys.readouterr().out
    assert "============ Serving Benchmark Result ============" in text
    assert "Maximum request concurrency:             2" in text
    assert res["completed"] == 6 and res["failed"] == 0
    assert server.max_in_flight == 2
    body = server.bodies[-1]
    assert body["model"] == "fake-model" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["ignore_eos"] is True and body["repetition_penalty"] == 1.0
    assert body["max_tokens"] == 4 and "temperature" not in body
    assert len(body["prompt"]) == 8 and all(isinstance(t, int) for t in body["prompt"])
    assert res["total_output_tokens"] == 6 * N_TOKENS
    assert all(len(itl) == N_TOKENS - 1 for itl in res["itls"])
    assert res["mean_ttft_ms"] >= FIRST * 1000 * 0.9
    assert res["mean_itl_ms"] == pytest.approx(GAP * 1000, rel=0.5)
    # TPOT = (latency - ttft) / (tokens - 1) = the mean gap of each request
    assert res["mean_tpot_ms"] == pytest.approx(res["mean_itl_ms"], rel=0.05)
    assert json.loads(out.read_text())["p50_ttft_ms"] == pytest.approx(res["p50_ttft_ms"])
    assert "P50 ITL (ms):" in text and "P99 TPOT (ms):" in text


def test_serve_counts_failures_and_sends_temperature(server, monkeypatch, capsys):
    from examples.bench import datasets

    real = datasets.sample_random

    def with_a_bad_prompt(*a, **k):
        reqs = real(*a, **k)
        reqs[-1].prompt[0] = 9999
        return reqs

    monkeypatch.setattr(datasets, "sample_random", with_a_bad_prompt)
    res = main(["serve", "--port", str(server.port), "--num-prompts", "3", "--input-len", "8",
                "--output-len", "2", "--temperature", "0.5", "--request-rate", "50"])
    text = capsys.readouterr().out
    assert (res["completed"], res["failed"]) == (2, 1)
    assert "Error 0: HTTPError: HTTP 400" in text
    assert "Request rate configured (RPS):           50.00" in text
    assert server.bodies[0]["temperature"] == 0.5 and "ignore_eos" not in server.bodies[0]
