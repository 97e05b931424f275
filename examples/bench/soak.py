"""Soak of examples/server: minutes of mixed, partly hostile traffic; RSS, probe latency, loss.

    python examples/bench/soak.py MODEL.gguf [--minutes 3 | --requests N] [--concurrency 8]
        [--kill-every-s 60] [--mix stream,complete,...] [--lib build/libvllm.so]
        [--port 8011] [--idle-s 5] [--server-flag=--kv-cache-memory-bytes=N ...]

Starts the server (engine core in its own process, --multiprocessing) and runs
--concurrency clients for --minutes (or until --requests were sent). Each client picks a
request kind from --mix at random (soak_requests.py: a streamed chat it may cut, a short
completion, a malformed request, a structured-output request, a hostile one). Every
--kill-every-s seconds the engine-core child is SIGKILLed; the soak measures how long
/health takes to turn 503, then restarts the server (as a supervisor would). A prober
sends GET /health and GET /v1/models every 0.2 s. Reports RSS (server, core) over time,
the RSS after the first requests, under load at the end and after --idle-s idle seconds,
the growth per answered request (the slope of RSS over requests answered by the last
server started, from its second sample on), the status of one more completion after the
idle wait, p50/p99 probe latency, and requests lost:
requests that got no HTTP answer at all (cut ones and those in flight at a kill
excluded). With --no-multiprocessing the core runs in the server (the CPU default, as the
README starts it) and "core" is 0.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import soak_requests  # noqa: E402
from probe_latency import call, percentile  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_EVERY_S = 10.0


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


def growth_kb_per_request(samples: list[tuple[float, float]]) -> float | None:
    """The least-squares slope of (requests answered, RSS MiB) samples, in KiB per
    request; None with fewer than two distinct request counts."""
    if len({n for n, _ in samples}) < 2:
        return None
    mean_n = sum(n for n, _ in samples) / len(samples)
    mean_r = sum(r for _, r in samples) / len(samples)
    cov = sum((n - mean_n) * (r - mean_r) for n, r in samples)
    var = sum((n - mean_n) ** 2 for n, _ in samples)
    return round(cov / var * 1024, 2)


class ServerProcess:
    def __init__(self, args) -> None:
        self.args, self.proc, self.url = args, None, f"http://127.0.0.1:{args.port}"

    def start(self) -> float:
        """Starts the server and sends it one request of each kind in --mix (the first
        request's RSS is the baseline); seconds until /health answered 200."""
        started = time.monotonic()
        mp = ["--multiprocessing"] if self.args.multiprocessing else []
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "examples/server/server.py"), self.args.model,
             "--port", str(self.args.port), "--served-model-name", soak_requests.MODEL,
             "--max-model-len", "2048", "--max-num-seqs", "16", *mp,
             "--body-read-timeout", "5", "--uvicorn-log-level", "error",
             *(["--lib", self.args.lib] if self.args.lib else []), *self.args.server_flag],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while call(self.url, "GET", "/health", None, {}, timeout=2) != 200:
            if self.proc.poll() is not None:
                raise SystemExit("the server exited during start-up")
            time.sleep(0.2)
        took = time.monotonic() - started
        for kind in dict.fromkeys(self.args.mix.split(",")):
            getattr(soak_requests, kind)(self.url, self.args.port, random.Random(0))
        return took

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
        self.mix = args.mix.split(",")
        self.stop_at = 0.0
        self.up = threading.Event()  # cleared from a kill until the restarted server is up
        self.lock = threading.Lock()
        self.counts = {"sent": 0, "answered": 0, "cut": 0, "lost": 0, "lost_at_kill": 0,
                       "5xx": 0}
        self.probe_ms: dict[str, list[float]] = {"/health": [], "/v1/models": []}
        self.rss: list[tuple[float, ...]] = []  # (s, server MiB, core MiB, answered)
        self.lifetime_start = 0  # index in self.rss of the last started server's first sample
        self.kills: list[dict] = []

    def count(self, key: str) -> None:
        with self.lock:
            self.counts[key] += 1

    def running(self) -> bool:
        """Until --minutes passed or --requests were sent."""
        return time.monotonic() < self.stop_at and (
            not self.args.requests or self.counts["sent"] < self.args.requests)

    def client(self, seed: int) -> None:
        rng = random.Random(seed)
        while self.running():
            if not self.up.wait(1):
                continue
            kind = rng.choice(self.mix)
            with self.lock:
                if self.args.requests and self.counts["sent"] >= self.args.requests:
                    return
                self.counts["sent"] += 1
            status = getattr(soak_requests, kind)(self.server.url, self.args.port, rng)
            if status == -1:
                self.count("cut")
            elif status == 0:
                self.count("lost" if self.up.is_set() else "lost_at_kill")
            else:
                self.count("answered")
                if status >= 500 and self.up.is_set():
                    self.count("5xx")

    def prober(self) -> None:
        while self.running():
            for path in self.probe_ms:
                if self.up.is_set():
                    started = time.monotonic()
                    call(self.server.url, "GET", path, None, {}, timeout=30)
                    if self.up.is_set():
                        self.probe_ms[path].append((time.monotonic() - started) * 1000)
            time.sleep(0.2)

    def sample(self, t0: float) -> None:
        server, core = self.server.rss()
        self.rss.append((round(time.monotonic() - t0), round(server), round(core),
                         self.counts["answered"] + self.counts["cut"]))

    def sampler(self, t0: float) -> None:
        while self.running():
            if self.up.is_set():
                self.sample(t0)
            time.sleep(SAMPLE_EVERY_S)

    def kill_and_restart(self, t0: float) -> None:
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
        self.lifetime_start = len(self.rss)
        self.sample(t0)
        self.up.set()

    def memory(self, first: tuple[float, ...], idle: tuple[float, ...]) -> dict:
        lifetime = self.rss[self.lifetime_start + 1:]
        return {
            "after_first_request_mb": {"server": first[1], "core": first[2]},
            "under_load_at_end_mb": {"server": self.rss[-1][1], "core": self.rss[-1][2]},
            "idle_after_mb": {"server": idle[1], "core": idle[2]},
            "idle_over_first": {k: round(idle[i] / first[i], 2) if first[i] else None
                                for i, k in ((1, "server"), (2, "core"))},
            "growth_kb_per_request": {
                "server": growth_kb_per_request([(s[3], s[1]) for s in lifetime]),
                "core": growth_kb_per_request([(s[3], s[2]) for s in lifetime])}}

    def run(self) -> dict:
        self.server.start()
        t0 = time.monotonic()
        self.sample(t0)
        self.up.set()
        self.stop_at = t0 + self.args.minutes * 60
        threads = [threading.Thread(target=self.client, args=(i,), daemon=True)
                   for i in range(self.args.concurrency)]
        threads += [threading.Thread(target=self.prober, daemon=True),
                    threading.Thread(target=self.sampler, args=(t0,), daemon=True)]
        for thread in threads:
            thread.start()
        next_kill = t0 + self.args.kill_every_s
        while self.running():
            if self.args.kill_every_s and time.monotonic() >= next_kill:
                self.kill_and_restart(t0)
                next_kill = time.monotonic() + self.args.kill_every_s
            time.sleep(0.5)
        for thread in threads:
            thread.join(180)
        self.sample(t0)
        first = self.rss[self.lifetime_start]
        time.sleep(self.args.idle_s)
        self.sample(t0)
        idle = self.rss.pop()
        after = soak_requests.complete(self.server.url, self.args.port, random.Random(0))
        self.server.stop()
        probes = {p: v for p, v in self.probe_ms.items() if v}
        return {"minutes": round((time.monotonic() - t0) / 60, 2),
                "concurrency": self.args.concurrency,
                "mix": self.args.mix, "requests": self.counts, "kills": self.kills,
                "memory": self.memory(first, idle), "status_of_a_request_after": after,
                "rss_mb_over_time_s_server_core_answered": self.rss,
                "p50_ms": {p: round(percentile(v, 0.5), 1) for p, v in probes.items()},
                "p99_ms": {p: round(percentile(v, 0.99), 1) for p, v in probes.items()},
                "probes": {p: len(v) for p, v in self.probe_ms.items()}}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model", help="the GGUF model file")
    p.add_argument("--minutes", type=float, default=3.0)
    p.add_argument("--requests", type=int, default=0,
                   help="stop once this many requests were sent (0: run --minutes)")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--kill-every-s", type=float, default=60.0, help="0: no kills")
    p.add_argument("--mix", default=soak_requests.DEFAULT_MIX,
                   help=f"comma-separated request kinds, repeated for weight: "
                   f"{', '.join(soak_requests.KINDS)}")
    p.add_argument("--multiprocessing", action=argparse.BooleanOptionalAction, default=True,
                   help="the engine core in its own process (needed for --kill-every-s)")
    p.add_argument("--idle-s", type=float, default=5.0,
                   help="idle seconds after the load before the last RSS sample")
    p.add_argument("--port", type=int, default=8011)
    p.add_argument("--lib", help="libvllm.so; default: the server's")
    p.add_argument("--server-flag", action="append", default=[],
                   help="one more server flag, repeatable (--server-flag=--kv-cache-memory-"
                   "bytes=67108864)")
    args = p.parse_args(argv)
    unknown = set(args.mix.split(",")) - set(soak_requests.KINDS)
    if unknown:
        p.error(f"unknown request kinds in --mix: {sorted(unknown)}")
    if args.kill_every_s and not args.multiprocessing:
        p.error("--kill-every-s needs --multiprocessing (0: no kills)")
    return args


def main() -> None:
    print(json.dumps(Soak(parse_args()).run(), indent=1))


if __name__ == "__main__":
    main()
