"""Soak of examples/server: minutes of mixed, partly hostile traffic; RSS, probe latency, loss.

    python examples/bench/soak.py MODEL.gguf [--minutes 3] [--concurrency 8]
        [--kill-every-s 60] [--lib build/libvllm.so] [--port 8011]

Starts the server (engine core in its own process, --multiprocessing) and runs
--concurrency clients for --minutes. Each client picks at random: a streamed chat it may
cut mid-stream (closing the socket), a short completion, a malformed request (broken JSON,
max_tokens=-1, Content-Length with Transfer-Encoding, an 18-hex-digit chunk size) or a
structured-output request. Every --kill-every-s seconds the engine-core child is
SIGKILLed; the soak measures how long /health takes to turn 503, then restarts the server
(as a supervisor would). A prober sends GET /health and GET /v1/models every 0.2 s.
Reports RSS (server, core) over time, p99 probe latency, and requests lost: requests that
got no HTTP answer at all (cut ones and those in flight at a kill excluded).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probe_latency import call, percentile  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MODEL = "soak"
HEADERS = {"Content-Type": "application/json"}
_INVALID = b'{"model": "soak", "max_tokens": -1, "prompt": "hi", "n": "two"}'


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def children(pid: int) -> list[int]:
    found = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if int((p / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(p.name))
            except (OSError, IndexError, ValueError):
                continue
    return found


class ServerProcess:
    def __init__(self, args) -> None:
        self.args, self.proc, self.url = args, None, f"http://127.0.0.1:{args.port}"

    def start(self) -> float:
        """Starts the server; seconds until /health answered 200."""
        started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "examples/server/server.py"), self.args.model,
             "--port", str(self.args.port), "--served-model-name", MODEL,
             "--max-model-len", "2048", "--max-num-seqs", "16", "--multiprocessing",
             "--body-read-timeout", "5", "--uvicorn-log-level", "error",
             *(["--lib", self.args.lib] if self.args.lib else [])],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while call(self.url, "GET", "/health", None, {}, timeout=2) != 200:
            if self.proc.poll() is not None:
                raise SystemExit("the server exited during start-up")
            time.sleep(0.2)
        return time.monotonic() - started

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def rss(self) -> tuple[float, float]:
        """(server process, engine-core process and other children) RSS in MiB."""
        return rss_mb(self.proc.pid), sum(rss_mb(c) for c in children(self.proc.pid))


class Soak:
    def __init__(self, args) -> None:
        self.args, self.server = args, ServerProcess(args)
        self.stop_at = 0.0
        self.up = threading.Event()  # cleared from a kill until the restarted server is up
        self.lock = threading.Lock()
        self.counts = {"sent": 0, "answered": 0, "cut": 0, "lost": 0, "lost_at_kill": 0,
                       "5xx": 0}
        self.probe_ms: dict[str, list[float]] = {"/health": [], "/v1/models": []}
        self.rss: list[tuple[float, ...]] = []  # (s, server MiB, core MiB)
        self.kills: list[dict] = []

    def count(self, key: str) -> None:
        with self.lock:
            self.counts[key] += 1

    # ------------------------------------------------------------------ clients

    def client(self, seed: int) -> None:
        rng = random.Random(seed)
        while time.monotonic() < self.stop_at:
            if not self.up.wait(1):
                continue
            kind = rng.choice(["stream", "stream", "complete", "malformed", "structured"])
            self.count("sent")
            status = getattr(self, f"_{kind}")(rng)
            if status == -1:
                self.count("cut")
            elif status == 0:
                self.count("lost" if self.up.is_set() else "lost_at_kill")
            else:
                self.count("answered")
                if status >= 500 and self.up.is_set():
                    self.count("5xx")

    def _stream(self, rng: random.Random) -> int:
        body = json.dumps({"model": MODEL, "stream": True, "max_tokens": rng.randint(8, 96),
                           "messages": [{"role": "user", "content": "Tell me a story."}]})
        cut_after = rng.choice([None, None, 1, 3])
        try:
            with socket.create_connection(("127.0.0.1", self.args.port), timeout=120) as s:
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                          b"application/json\r\nContent-Length: %d\r\n\r\n%s"
                          % (len(body), body.encode()))
                reader = s.makefile("rb")
                status = int(reader.readline().split()[1])
                events = 0
                while line := reader.readline():
                    events += line.startswith(b"data:")
                    if cut_after is not None and events >= cut_after:
                        return -1  # the client leaves mid-stream
                return status
        except (OSError, IndexError, ValueError):
            return 0

    def _complete(self, rng: random.Random) -> int:
        return call(self.server.url, "POST", "/v1/completions", {
            "model": MODEL, "prompt": "Hello " * rng.randint(1, 300),
            "max_tokens": rng.randint(1, 16)}, HEADERS, timeout=120)

    def _structured(self, rng: random.Random) -> int:
        schema = {"type": "object", "properties": {
            f"k{i}": {"type": "string", "maxLength": rng.randint(2, 9)} for i in range(4)}}
        return call(self.server.url, "POST", "/v1/chat/completions", {
            "model": MODEL, "max_tokens": 12, "messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "s", "schema": schema}}},
            HEADERS, timeout=120)

    def _malformed(self, rng: random.Random) -> int:
        raw = [b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
               b"Transfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\nab",
               b"Content-Length: 9\r\n\r\n{\"model\":",
               b"Content-Length: %d\r\n\r\n%s" % (len(_INVALID), _INVALID)]
        try:
            with socket.create_connection(("127.0.0.1", self.args.port), timeout=30) as s:
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                          b"application/json\r\n" + rng.choice(raw))
                return int(s.makefile("rb").readline().split()[1])
        except (OSError, IndexError, ValueError):
            return 0

    # ------------------------------------------------------------------ prober, killer

    def prober(self) -> None:
        while time.monotonic() < self.stop_at:
            for path in self.probe_ms:
                if self.up.is_set():
                    started = time.monotonic()
                    call(self.server.url, "GET", path, None, {}, timeout=30)
                    if self.up.is_set():
                        self.probe_ms[path].append((time.monotonic() - started) * 1000)
            time.sleep(0.2)

    def sampler(self, t0: float) -> None:
        while time.monotonic() < self.stop_at:
            self.rss.append((round(time.monotonic() - t0), *map(round, self.server.rss())))
            time.sleep(10)

    def kill_and_restart(self) -> None:
        core = [c for c in children(self.server.proc.pid)
                if b"engine_core_proc" in Path(f"/proc/{c}/cmdline").read_bytes()]
        if not core:
            return
        self.up.clear()
        os.kill(core[0], signal.SIGKILL)
        killed = time.monotonic()
        while call(self.server.url, "GET", "/health", None, {}, timeout=5) == 200:
            time.sleep(0.02)
        detected = time.monotonic() - killed
        self.server.stop()
        restart = self.server.start()
        self.kills.append({"health_503_after_s": round(detected, 3),
                           "restart_s": round(restart, 1)})
        self.up.set()

    def run(self) -> dict:
        self.server.start()
        self.up.set()
        t0 = time.monotonic()
        self.stop_at = t0 + self.args.minutes * 60
        threads = [threading.Thread(target=self.client, args=(i,), daemon=True)
                   for i in range(self.args.concurrency)]
        threads += [threading.Thread(target=self.prober, daemon=True),
                    threading.Thread(target=self.sampler, args=(t0,), daemon=True)]
        for thread in threads:
            thread.start()
        next_kill = t0 + self.args.kill_every_s
        while time.monotonic() < self.stop_at:
            if self.args.kill_every_s and time.monotonic() >= next_kill:
                self.kill_and_restart()
                next_kill = time.monotonic() + self.args.kill_every_s
            time.sleep(0.5)
        for thread in threads:
            thread.join(180)
        self.rss.append((round(time.monotonic() - t0), *map(round, self.server.rss())))
        self.server.stop()
        return {"minutes": self.args.minutes, "concurrency": self.args.concurrency,
                "requests": self.counts, "kills": self.kills,
                "rss_mb_over_time_server_core": self.rss,
                "p99_ms": {p: round(percentile(v, 0.99), 1) for p, v in self.probe_ms.items()
                           if v},
                "probes": {p: len(v) for p, v in self.probe_ms.items()}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model", help="the GGUF model file")
    p.add_argument("--minutes", type=float, default=3.0)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--kill-every-s", type=float, default=60.0, help="0: no kills")
    p.add_argument("--port", type=int, default=8011)
    p.add_argument("--lib", help="libvllm.so; default: the server's")
    print(json.dumps(Soak(p.parse_args()).run(), indent=1))


if __name__ == "__main__":
    main()
