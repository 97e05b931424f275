"""examples/bench/soak.py and probe_latency.py in seconds, against a stand-in server
(tests/fake_openai_server.py) instead of a model: every request kind gets its answer, the
soak's counts add up (sent = answered + cut + lost), its report has the RSS, growth and
latency fields, the growth is the least-squares slope, and the probe script reports every
probe with the status it expects. The figures themselves come from runs on the real server
(docs/BENCHMARKS.md), not from here."""

from __future__ import annotations

import json
import os
import random

import pytest
from fake_openai_server import FakeServer

from examples.bench import probe_latency, soak
from examples.bench import soak_requests as kinds


def test_growth_is_the_least_squares_slope_in_kib():
    assert soak.growth_kb_per_request([(0, 100.0), (10, 101.0), (20, 102.0)]) == 102.4
    assert soak.growth_kb_per_request([(0, 100.0), (10, 100.0)]) == 0.0
    assert soak.growth_kb_per_request([(5, 100.0), (5, 200.0)]) is None  # no requests between


def test_arguments_are_checked():
    with pytest.raises(SystemExit):
        soak.parse_args(["m.gguf", "--mix", "stream,nonsense"])
    with pytest.raises(SystemExit):  # a kill needs the core in its own process
        soak.parse_args(["m.gguf", "--no-multiprocessing"])
    args = soak.parse_args(["m.gguf", "--no-multiprocessing", "--kill-every-s", "0"])
    assert not args.multiprocessing and args.mix == kinds.DEFAULT_MIX


@pytest.mark.parametrize("kind", kinds.KINDS)
def test_each_request_kind_gets_an_answer(kind):
    with FakeServer() as server:
        for seed in range(6):
            status = getattr(kinds, kind)(server.url, server.port, random.Random(seed))
            assert status == -1 or 200 <= status < 500, (kind, seed, status)


def test_malformed_and_hostile_requests_get_4xx():
    with FakeServer() as server:
        for seed in range(8):
            assert 400 <= kinds.malformed(server.url, server.port, random.Random(seed)) < 500
        assert kinds.hostile(server.url, server.port, random.Random(0)) in (200, 400)


class _FakeProcess:
    """soak.ServerProcess's interface on a FakeServer: the RSS is this process's."""

    def __init__(self, args) -> None:
        self.args, self.fake = args, FakeServer()
        self.url = ""

    def start(self) -> float:
        self.fake.__enter__()
        self.url, self.args.port = self.fake.url, self.fake.port
        return 0.0

    def stop(self) -> None:
        self.fake.__exit__(None, None, None)

    def rss(self) -> tuple[float, float]:
        return soak.rss_mb(os.getpid()), 0.0


def test_a_short_soak_counts_every_request_and_reports_memory(monkeypatch):
    monkeypatch.setattr(soak, "ServerProcess", _FakeProcess)
    monkeypatch.setattr(soak, "SAMPLE_EVERY_S", 0.5)
    args = soak.parse_args(["m.gguf", "--minutes", "0.05", "--concurrency", "3",
                            "--kill-every-s", "0", "--idle-s", "0",
                            "--mix", "stream,complete,malformed"])
    report = soak.Soak(args).run()
    counts = report["requests"]
    assert counts["sent"] > 0 and counts["lost"] == 0 and counts["5xx"] == 0
    assert counts["sent"] == counts["answered"] + counts["cut"] + counts["lost"]
    assert report["status_of_a_request_after"] == 200
    memory = report["memory"]
    assert memory["after_first_request_mb"]["server"] > 0
    assert set(memory["growth_kb_per_request"]) == {"server", "core"}
    assert len(report["rss_mb_over_time_s_server_core_answered"]) >= 2
    assert report["probes"]["/health"] > 0 and report["p99_ms"]["/health"] >= 0


def test_probe_latency_reports_each_probe_with_its_expected_status(monkeypatch, capsys):
    with FakeServer() as server:
        monkeypatch.setattr("sys.argv", [
            "probe_latency.py", "--url", server.url, "--model", "m", "--probes", "3",
            "--streams", "1", "--stream-tokens", "4", "--prompt-tokens", "8",
            "--warmup-s", "0.2", "--interval-ms", "0"])
        probe_latency.main()
        answered = dict(server.answered)
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(report["latency"]) == set(probe_latency.probes("m"))
    for name, figures in report["latency"].items():
        assert figures["wrong_status"] == 0, name
        assert 0 <= figures["p50_ms"] <= figures["p99_ms"] <= figures["max_ms"]
    assert answered["/health"] == 3 and answered["/tokenize"] == 3


def test_a_soak_stops_after_its_requests(monkeypatch):
    monkeypatch.setattr(soak, "ServerProcess", _FakeProcess)
    args = soak.parse_args(["m.gguf", "--requests", "7", "--minutes", "5", "--concurrency",
                            "3", "--kill-every-s", "0", "--idle-s", "0", "--mix", "complete"])
    report = soak.Soak(args).run()
    assert report["requests"]["sent"] == 7 == report["requests"]["answered"]
    assert report["minutes"] < 1
