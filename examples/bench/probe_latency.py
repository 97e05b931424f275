"""Probe latencies of examples/server under load: no client should wait on another's work.

    python examples/bench/probe_latency.py --url http://127.0.0.1:8000 --model NAME
        [--probes 50] [--streams 8] [--stream-tokens 256] [--prompt-tokens 2000]

While --streams streamed chat completions and one completion with a --prompt-tokens prompt
run (restarted as they end, so the load lasts as long as the probes), sends --probes
requests of each kind in turn, --interval-ms apart: GET /health, GET /v1/models,
GET /metrics, POST /tokenize "hi" and a chat completion with max_tokens=-1 (a 400).
Prints p50 / p99 / max in ms per kind, the load done meanwhile, and one JSON line.
vLLM's API server answers all five without waiting on the engine
(vllm/entrypoints/serve/instrumentator/health.py, openai/models/serving.py); so should this
one.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import threading
import time
from urllib.parse import urlsplit


def _conn(url: str, timeout: float) -> http.client.HTTPConnection:
    parts = urlsplit(url)
    return http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)


def call(url: str, method: str, path: str, body: dict | None, headers: dict,
         timeout: float = 600, stream: bool = False, on_event=None) -> int:
    """The status (0: no answer); a streamed body is read to its end (on_event() per SSE
    event)."""
    conn = _conn(url, timeout)
    try:
        conn.request(method, path, body=None if body is None else json.dumps(body),
                     headers=headers)
        res = conn.getresponse()
        if stream:
            while line := res.readline():
                if on_event is not None and line.startswith(b"data:"):
                    on_event()
        else:
            res.read()
        return res.status
    except OSError:
        return 0
    finally:
        conn.close()


class Load:
    """The streamed chats and the long prompt, each restarted until stop()."""

    def __init__(self, args, headers: dict) -> None:
        self.args, self.headers = args, headers
        self.running = threading.Event()
        self.running.set()
        self.threads = [threading.Thread(target=self._loop, args=(self._chat,), daemon=True)
                        for _ in range(args.streams)]
        self.threads.append(threading.Thread(target=self._loop, args=(self._prefill,),
                                             daemon=True))
        self.finished = 0
        self.events = 0  # SSE events the streams received
        self.prefills = 0  # long prompts answered

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        self.running.clear()

    def _loop(self, work) -> None:
        while self.running.is_set():
            work()
            self.finished += 1

    def _chat(self) -> None:
        call(self.args.url, "POST", "/v1/chat/completions", {
            "model": self.args.model, "stream": True, "ignore_eos": True,
            "max_tokens": self.args.stream_tokens,
            "messages": [{"role": "user", "content": "Tell me a long story."}]},
            self.headers, stream=True, on_event=self._event)

    def _event(self) -> None:
        self.events += 1

    def _prefill(self) -> None:
        call(self.args.url, "POST", "/v1/completions", {
            "model": self.args.model, "prompt": " ".join(["word"] * self.args.prompt_tokens),
            "max_tokens": 16}, self.headers)
        self.prefills += 1


def probes(model: str) -> dict[str, tuple[str, str, dict | None, int]]:
    return {
        "/health": ("GET", "/health", None, 200),
        "/v1/models": ("GET", "/v1/models", None, 200),
        "/metrics": ("GET", "/metrics", None, 200),
        "/tokenize": ("POST", "/tokenize", {"model": model, "prompt": "hi"}, 200),
        "max_tokens=-1": ("POST", "/v1/chat/completions", {
            "model": model, "max_tokens": -1,
            "messages": [{"role": "user", "content": "hi"}]}, 400),
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--model", required=True, help="the served model name")
    p.add_argument("--api-key")
    p.add_argument("--probes", type=int, default=50)
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--stream-tokens", type=int, default=256)
    p.add_argument("--prompt-tokens", type=int, default=2000)
    p.add_argument("--warmup-s", type=float, default=2.0, help="load before the first probe")
    p.add_argument("--interval-ms", type=float, default=50.0, help="pause between probes")
    args = p.parse_args()
    headers = {"Content-Type": "application/json"}
    if args.api_key:
        headers["Authorization"] = f"Bearer {args.api_key}"
    load = Load(args, headers)
    load.start()
    time.sleep(args.warmup_s)
    kinds = probes(args.model)
    events_before, prefills_before = load.events, load.prefills
    times: dict[str, list[float]] = {name: [] for name in kinds}
    wrong: dict[str, int] = dict.fromkeys(kinds, 0)
    for _ in range(args.probes):
        for name, (method, path, body, want) in kinds.items():
            started = time.monotonic()
            status = call(args.url, method, path, body, headers, timeout=60)
            times[name].append((time.monotonic() - started) * 1000)
            wrong[name] += status != want
            time.sleep(args.interval_ms / 1000)
    events, prefills = load.events - events_before, load.prefills - prefills_before
    load.stop()
    report = {name: {"p50_ms": round(statistics.median(v), 1),
                     "p99_ms": round(percentile(v, 0.99), 1), "max_ms": round(max(v), 1),
                     "wrong_status": wrong[name]} for name, v in times.items()}
    print(f"during the probes: {events} stream events, {prefills} long prompts answered")
    print(f"{'probe':<16}{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}{'wrong':>7}")
    for name, r in report.items():
        print(f"{name:<16}{r['p50_ms']:>10}{r['p99_ms']:>10}{r['max_ms']:>10}"
              f"{r['wrong_status']:>7}")
    print(json.dumps({"probes": args.probes, "streams": args.streams,
                      "prompt_tokens": args.prompt_tokens, "stream_events_during": events,
                      "long_prompts_done_during": prefills,
                      "latency": report}))


if __name__ == "__main__":
    main()
