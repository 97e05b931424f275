"""examples/bench/sweep.py and sweep_plot.py end to end on CPU: a smoke sweep (a tiny
Llama-shaped config.json with --load-format dummy, 2 concurrencies, a few prompts of 16
tokens in and 4 out) through examples/server on build/libvllm.so, then the plot and table
of its JSONs. Ports vLLM's tests/benchmarks/sweep/test_param_sweep.py
(test_run_comb_continue_on_error_keeps_later_runs: a failed run is recorded in a
.failure.json and the later runs are kept) to this fixed sweep, for a point and for a
whole server.

Oracles: the workload itself (ignore_eos: every request yields --output-len tokens; token
prompts without BOS: exactly --input-len prompt tokens; prompts per point
max(--num-prompts, ceil(M * C))) and the JSON files the table is built from.
"""

from __future__ import annotations

import argparse
import json
import math
import socket

import pytest

from examples.bench import sweep, sweep_plot

pytestmark = [pytest.mark.capi, pytest.mark.slow]

TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 10240, "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "bos_token_id": 1, "eos_token_id": 2}
IN_LEN, OUT_LEN, MIN_PROMPTS, MULT = 16, 4, 3, 2.0
CONCURRENCY = (1, 2)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def swept(built, tmp_path_factory):
    """(out_dir, exit code, stdout) of one sweep over an unloadable model, then the tiny
    one; the first server's failure must not stop the second."""
    root = tmp_path_factory.mktemp("sweep")
    for name, config in (("broken", {"architectures": ["NoSuchForCausalLM"]}),
                         ("tiny", TINY)):
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(config))
    out = root / "out"
    argv = ["--model-path", str(root / "broken"), str(root / "tiny"),
            "--concurrency", *map(str, CONCURRENCY), "--num-prompts", str(MIN_PROMPTS),
            "--prompts-per-concurrency-multiplier", str(MULT), "--input-len", str(IN_LEN),
            "--output-len", str(OUT_LEN), "--dtype", "float32", "--max-model-len", "64",
            "--max-num-seqs", "4", "--port", str(_free_port()), "--out-dir", str(out),
            "--lib", str(built / "libvllm.so")]
    with pytest.MonkeyPatch.context() as patch:
        lines: list[str] = []
        patch.setattr("builtins.print", lambda *a, **k: lines.append(" ".join(map(str, a))))
        rc = sweep.main(argv)
    return out, rc, "\n".join(lines)


def test_sweep_writes_one_result_per_point(swept):
    out, rc, text = swept
    seeds = set()
    for c in CONCURRENCY:
        n = max(MIN_PROMPTS, math.ceil(MULT * c))
        data = json.loads((out / f"tiny-concurrency{c}.json").read_text())
        assert data["model_id"] == "tiny" and data["max_concurrency"] == c
        assert data["num_prompts"] == n and data["completed"] == n and data["failed"] == 0
        assert data["total_input_tokens"] == n * IN_LEN
        assert data["total_output_tokens"] == n * OUT_LEN
        assert data["request_rate"] == "inf" and data["run_number"] == 0
        assert data["median_ttft_ms"] > 0 and data["median_tpot_ms"] > 0
        assert data["mean_e2el_ms"] > 0  # --percentile-metrics ttft,tpot,itl,e2el
        assert not set(sweep.DETAILED_FIELDS) & set(data)  # no --save-detailed
        assert "Maximum request concurrency:" in (out / f"tiny-concurrency{c}.log").read_text()
        seeds.add(data["seed"])
    assert len(seeds) == len(CONCURRENCY)  # no point reuses another's prompts
    assert "ready in" in (out / "tiny-server.log").read_text()


def test_failed_server_is_recorded_and_the_sweep_goes_on(swept):
    out, rc, text = swept
    failure = json.loads((out / "broken-server.failure.json").read_text())
    assert failure["error_type"] == "RuntimeError"
    assert failure["error"].startswith("Server process crashed with return code")
    assert any("NoSuchForCausalLM" in line for line in failure["log_tail"])
    assert not list(out.glob("broken-concurrency*"))
    assert rc == 1 and "Not done: broken: server RuntimeError" in text


def test_sweep_prints_the_table_last(swept):
    out, rc, text = swept
    rows = text.splitlines()[-len(CONCURRENCY):]
    for c, row in zip(CONCURRENCY, rows):
        data = json.loads((out / f"tiny-concurrency{c}.json").read_text())
        assert row.startswith(f"| tiny | {c} | {data['num_prompts']} | 0 | "
                              f"{data['request_throughput']:.2f} |")


def test_plot_and_table(swept, capsys):
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib (pip install "
                        "matplotlib); the sweep and its table do not")
    out, _, _ = swept
    fig = sweep_plot.main([str(out), "--fig-dir", str(out / "fig"), "--fig-name", "smoke"])
    assert fig == out / "fig" / "smoke.png"
    assert fig.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = capsys.readouterr().out.splitlines()
    assert lines[-4].startswith("| Model | Max concurrency | Num prompts | Failed | "
                                "Request throughput (req/s) |")
    for c, row in zip(CONCURRENCY, lines[-2:]):
        data = json.loads((out / f"tiny-concurrency{c}.json").read_text())
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert cells[:4] == ["tiny", str(c), str(data["num_prompts"]), "0"]
        assert cells[6] == f"{data['median_ttft_ms']:.2f}"
        assert cells[8] == f"{data['median_tpot_ms']:.2f}"


def test_budget_spent_skips_every_model(tmp_path, capsys):
    """A budget that is over before the first server starts: nothing runs, nothing is
    written but the empty table, exit 1."""
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(TINY))
    rc = sweep.main(["--model-path", str(tmp_path / "m"), "--concurrency", "1",
                     "--budget-s", "1e-9", "--out-dir", str(tmp_path / "out")])
    text = capsys.readouterr().out
    assert rc == 1 and "[SKIPPED SERVER] m: the budget is spent" in text
    assert list((tmp_path / "out").iterdir()) == []


def test_bad_arguments(tmp_path, capsys):
    with pytest.raises(SystemExit):
        sweep.main(["--concurrency", "1"])
    assert "Give at least one model" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sweep.main(["--model-path", str(tmp_path), "--concurrency", "1"])
    assert "neither a .gguf file nor a directory with a config.json" in \
        capsys.readouterr().err
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(SystemExit):
        sweep.main(["--model-path", str(tmp_path), "--concurrency", "0"])
    assert "--concurrency and --num-prompts must be at least 1" in capsys.readouterr().err
    with pytest.raises(ValueError, match="Did not find any parameter sweep results under"):
        sweep_plot.main([str(tmp_path)])
    with pytest.raises(ValueError, match="No parameter sweep results under"):
        sweep_plot.main([str(tmp_path / "absent")])


def test_failed_point_is_recorded_and_later_points_kept(monkeypatch, tmp_path):
    """vLLM's test_run_comb_continue_on_error_keeps_later_runs, with a fake server; the
    label has a dot, as qwen3.5-35b-a3b."""
    class FakeServer:
        def __init__(self, *args) -> None:
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            pass

        def wait_until_ready(self, timeout: float) -> None:
            pass

    calls: list[int] = []

    def fake_run_point(args, server, label, vocab, concurrency, out_dir, deadline):
        calls.append(concurrency)
        if concurrency == 1:
            (out_dir / f"{label}-concurrency1.log").write_text("client said why\n")
            raise RuntimeError("synthetic run failure")
        return {"max_concurrency": concurrency}

    monkeypatch.setattr(sweep, "ServerProcess", FakeServer)
    monkeypatch.setattr(sweep, "run_point", fake_run_point)
    model = tmp_path / "m3.5"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY))
    parser = argparse.ArgumentParser()
    sweep.add_cli_args(parser)
    args = parser.parse_args(["--model-path", str(model), "--concurrency", "1", "4"])
    done, missed = sweep.run_model(args, "m3.5", model, tmp_path, math.inf)
    assert calls == [1, 4] and done == [{"max_concurrency": 4}]
    assert missed == ["m3.5 max_concurrency=1: RuntimeError"]
    failure = json.loads((tmp_path / "m3.5-concurrency1.failure.json").read_text())
    assert failure["error"] == "synthetic run failure"
    assert failure["bench_overrides"] == {"max_concurrency": 1}
    assert failure["log_tail"] == ["client said why"]
