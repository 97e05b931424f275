"""`python -m examples.bench throughput|latency|startup`, examples/bench/profile_step.py and
profile_run.py end to end on CPU, with a tiny Llama-shaped config and --load-format dummy (token-id
prompts, no tokenizer), and the suite's child step on the same tiny shapes. Checks
vLLM's printed lines and JSON keys (vllm/benchmarks/throughput.py, latency.py) and that
the token counts are what the workload asks for."""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path

import pytest

from examples.bench import jit_phases, profile_run, profile_step, startup, suite
from examples.bench.__main__ import main

TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 10240, "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "bos_token_id": 1, "eos_token_id": 2}
FLOAT = r"[0-9]+(?:\.[0-9]+)?(?:e-?[0-9]+)?"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny") / "llama-3.1-8b"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(TINY))
    return d


def _engine_flags(tiny):
    return ["--model", str(tiny), "--load-format", "dummy", "--skip-tokenizer-init",
            "--device", "cpu"]


def test_throughput(tiny, tmp_path, capsys):
    out = tmp_path / "tp.json"
    res = main(["throughput", "--input-len", "48", "--output-len", "6", "--num-prompts", "12",
                "--random-range-ratio", "0.5", "--output-json", str(out), *_engine_flags(tiny)])
    text = capsys.readouterr().out
    assert re.search(rf"^Throughput: {FLOAT} requests/s, {FLOAT} total tokens/s, {FLOAT} "
                     "output tokens/s$", text, re.M)
    saved = json.loads(out.read_text())
    assert saved["num_requests"] == 12
    assert f"Total num prompt tokens:  {saved['total_prompt_tokens']}" in text
    assert f"Total num output tokens:  {saved['total_output_tokens']}" in text
    assert 12 * 24 <= saved["total_prompt_tokens"] <= 12 * 72  # 48 +- 50%
    assert 12 * 3 <= saved["total_output_tokens"] <= 12 * 9  # ignore_eos: all generated
    assert saved["total_num_tokens"] == saved["total_prompt_tokens"] + \
        saved["total_output_tokens"]
    assert saved["requests_per_second"] == pytest.approx(12 / saved["elapsed_time"])
    assert "Peak GPU memory: n/a" in text and res == saved


def test_jit_phases_reports_compiles_by_phase(tiny, capsys, monkeypatch):
    """examples/bench/jit_phases.py: one engine, a throughput run per `prompts:seed`, the
    Triton compiles of each phase summed by kernel (CPU: the interpreter compiles nothing;
    the hooks are fed by hand)."""
    import triton

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")  # main sets 0; restored after
    for hook in ("jit_cache_hook", "jit_post_compile_hook"):
        monkeypatch.setattr(triton.knobs.runtime, hook, None)
    jit_phases.main(["3:0,2:1", "--input-len", "16", "--output-len", "3", *_engine_flags(tiny)])
    text = capsys.readouterr().out
    assert re.search(rf"^JIT start-up took {FLOAT}s$", text, re.M)
    assert "JIT start-up: 0 compiles 0.0s: \n" in text
    assert text.count("Throughput:") == 2 and "JIT run 3:0: 0 compiles" in text
    assert "JIT run 2:1: 0 compiles" in text
    for key, name in ((1, "m.a"), (2, "m.b"), (3, "m.a")):
        jit_phases._pre(key=key)
        jit_phases._post(key=key, fn=type("Info", (), {"name": name})())
    jit_phases.report("x")
    line = capsys.readouterr().out
    assert re.match(rf"JIT x: 3 compiles {FLOAT}s: ", line)
    assert re.search(rf"\ba 2/{FLOAT}s", line) and re.search(rf"\bb 1/{FLOAT}s", line)
    jit_phases.report("y")
    assert capsys.readouterr().out == "JIT y: 0 compiles 0.0s: \n"


def test_latency(tiny, capsys):
    res = main(["latency", "--batch-size", "3", "--input-len", "16", "--output-len", "5",
                "--num-iters-warmup", "1", "--num-iters", "4", *_engine_flags(tiny)])
    text = capsys.readouterr().out
    assert re.search(rf"^Avg latency: {FLOAT} seconds$", text, re.M)
    for p in (10, 25, 50, 75, 90, 99):
        assert re.search(rf"^{p}% percentile latency: {FLOAT} seconds$", text, re.M)
    assert len(res["latencies"]) == 4 and res["decode_tokens_per_second"] > 0
    assert 0 < res["first_step_seconds"] < res["avg_latency"]


def test_latency_with_async_scheduling(tiny, capsys):
    """The first step ends when its tokens reach the scheduler, not when step() queued it."""
    res = main(["latency", "--batch-size", "2", "--input-len", "16", "--output-len", "5",
                "--num-iters-warmup", "0", "--num-iters", "2", "--async-scheduling",
                *_engine_flags(tiny)])
    assert res["decode_tokens_per_second"] > 0
    assert 0 < res["first_step_seconds"] < res["avg_latency"]


def test_profile_step(tiny, tmp_path, capsys):
    res = profile_step.main(["--batch-size", "2", "--input-len", "16", "--output-len", "5",
                             "--out", str(tmp_path), *_engine_flags(tiny)])
    assert res["decode_steps"] == 4  # 5 tokens: the prefill samples the first
    assert res["wall_us_per_step"] > 0 and res["kernels"] == []  # no CUDA kernels on CPU
    assert json.loads((tmp_path / "profile_step-b2.json").read_text()) == res
    assert "decode steps 4, batch 2" in capsys.readouterr().out


@pytest.mark.parametrize("concurrency, steps, buckets", [
    (2, 9, [(1, 1), (64, 7)]),  # two in flight: a new prefill joins as one finishes
    (0, 3, [(64, 2)]),  # all five prefill in one step, then two decode steps
], ids=["closed-loop", "all-at-once"])
def test_profile_run(tiny, tmp_path, concurrency, steps, buckets):
    """A closed loop keeps `concurrency` requests in flight (0: all at once, as
    `throughput`); in process the steps are grouped by scheduled tokens, each wall paired
    with the step planned one call earlier (the first call plans without a wall)."""
    res = profile_run.main(["--num-prompts", "5", "--input-len", "12", "--output-len", "3",
                            "--max-concurrency", str(concurrency), "--no-multiprocessing",
                            "--out", str(tmp_path), *_engine_flags(tiny)])
    assert res["requests_per_second"] > 0 and "kernels" not in res  # no --profile
    assert res["steps"] == steps
    assert [(row["tokens_le"], row["steps"]) for row in res["step_table"]] == buckets
    assert res["max_running"] == (concurrency or 5) and res["num_preemptions"] == 0
    assert res["num_gpu_blocks"] > 0
    name = f"profile_run-c{concurrency}-inproc.json"
    assert json.loads((tmp_path / name).read_text()) == res


def test_startup_cold_and_warm(tiny, tmp_path, capsys):
    """vllm bench startup (tests/benchmarks/test_bench_startup.py runs the command; here
    with few iterations): each iteration a fresh process, vLLM's keys and lines."""
    out = tmp_path / "startup.json"
    res = main(["startup", "--num-iters-cold", "2", "--num-iters-warmup", "0",
                "--num-iters-warm", "1", "--output-json", str(out), *_engine_flags(tiny)])
    text = capsys.readouterr().out
    assert json.loads(out.read_text()) == json.loads(json.dumps(res))
    for phase, n in (("cold", 2), ("warm", 1)):
        totals = res[f"{phase}_startup_times"]
        assert len(totals) == n and all(t > 0 for t in totals)
        assert res[f"avg_{phase}_startup_time"] == pytest.approx(sum(totals) / n)
        for i, total in enumerate(totals):  # the phases of every iteration add up
            assert total == pytest.approx(sum(res[f"{phase}_{m}_times"][i] for m in (
                "import", "engine_init", "first_token")))
        assert res[f"{phase}_cudagraph_capture_times"] == [0.0] * n  # no graphs on CPU
        percentiles = list(res[f"{phase}_startup_percentiles"].values())
        assert list(res[f"{phase}_startup_percentiles"]) == [10, 25, 50, 75, 90, 99]
        assert percentiles == sorted(percentiles)
    assert re.search(rf"^COLD STARTUP:\nAvg startup time: {FLOAT} seconds$", text, re.M)
    assert re.search(rf"^WARM STARTUP:\nAvg startup time: {FLOAT} seconds$", text, re.M)
    assert re.search(rf"^  50%: {FLOAT} seconds$", text, re.M)


def test_cold_startup_gives_an_empty_triton_cache_of_its_own(monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", "/users/cache")
    with startup.cold_startup() as first:
        assert os.environ["TRITON_CACHE_DIR"] == first and os.listdir(first) == []
        (Path(first) / "kernel.cubin").write_bytes(b"compiled")
    assert not os.path.exists(first) and os.environ["TRITON_CACHE_DIR"] == "/users/cache"
    monkeypatch.delenv("TRITON_CACHE_DIR")
    with startup.cold_startup() as second:
        assert second != first and os.listdir(second) == []
    assert "TRITON_CACHE_DIR" not in os.environ


def test_startup_iteration_failure_is_reported(tmp_path):
    parser = argparse.ArgumentParser()
    startup.add_cli_args(parser)
    args = parser.parse_args(["--model", str(tmp_path / "absent"), "--device", "cpu"])
    with pytest.raises(RuntimeError, match="(?s)startup iteration failed.*does not exist"):
        startup.run_iteration(args)
    args.iteration_timeout = 0.01
    with pytest.raises(RuntimeError, match="startup iteration took over 0.01 s"):
        startup.run_iteration(args)
    with pytest.raises(SystemExit):
        parser.parse_args(["--num-iters-cold", "-1"])


def test_suite_step_and_table(tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(suite, "MODELS", tiny.parent)
    monkeypatch.setattr(suite, "COMMON", [*suite.COMMON, "--device", "cpu", "--dtype", "float32"])
    monkeypatch.setattr(suite, "LAT", ["--input-len", "8", "--output-len", "4",
                                       "--num-iters-warmup", "0", "--num-iters", "1"])
    monkeypatch.setitem(suite.STEPS, "llama8b-graphs", ("llama-3.1-8b", [], [1, 8]))
    monkeypatch.setattr(suite, "SHAREGPT_PROMPTS", 3)
    monkeypatch.setattr(suite, "THROUGHPUT_LENS", (64, 4))
    suite.run_step("llama8b-graphs", tmp_path, throughput_prompts=2)
    res = json.loads((tmp_path / "suite-llama8b-graphs.json").read_text())
    assert res["throughput"]["num_requests"] == 2
    assert res["throughput"]["total_prompt_tokens"] == 2 * 64
    assert res["throughput_sharegpt"]["num_requests"] == suite.SHAREGPT_PROMPTS
    assert res["latency_b8"]["decode_tokens_per_second"] > 0
    table = suite.table({"llama8b-graphs": res}, {"qwen3-8b": "PENDING: budget"})
    capsys.readouterr()
    rows = {line.split(" | ")[0].strip(): line for line in table.splitlines()}
    qwen = [c.strip() for c in rows["Qwen3-8B b1 decode, CUDA graphs"].split(" | ")]
    assert qwen[1:3] == ["PENDING tok/s", "PENDING: budget"]
    # no GPU measured a copy bandwidth: the H200's 4.28 TB/s over Llama's 15.01 GB a step
    assert res["copy_tbps"] is None
    assert "the H200's, none measured" in rows["device-to-device copy (rooflines below)"]
    assert "of 285 roofline" in rows["Llama-8B b1 decode, CUDA graphs"]
    measured = suite.table({"llama8b-graphs": {**res, "copy_tbps": 2.44}}, {})
    assert "of 163 roofline" in measured  # 2.44e12 / 15.01e9: the step's own bandwidth
    assert "req/s" in rows["Llama-8B throughput 2 x (64, 4)"]
    assert "PENDING" not in rows["Llama-8B start-up to first token (graphs)"]
    assert "graph capture 0.00" in rows["Llama-8B start-up to first token (graphs)"]
    # the --max-num-seqs 64 throughput row, from its own step
    monkeypatch.setattr(suite, "SEQS64_PROMPTS", 2)
    suite.run_step("llama8b-seqs64", tmp_path, throughput_prompts=0)
    s64 = json.loads((tmp_path / "suite-llama8b-seqs64.json").read_text())
    assert "--max-num-seqs" in s64["engine_flags"] and s64["throughput"]["num_requests"] == 2
    table = suite.table({"llama8b-graphs": res, "llama8b-seqs64": s64}, {})
    row = next(line for line in table.splitlines() if "--max-num-seqs 64" in line)
    assert "req/s" in row and ">= 26" in row


def test_latency_decode_rate_needs_one_prefill_step(tiny, capsys):
    res = main(["latency", "--batch-size", "3", "--input-len", "16", "--output-len", "3",
                "--num-iters-warmup", "0", "--num-iters", "1", "--max-num-batched-tokens", "32",
                "--max-num-seqs", "4",
                *_engine_flags(tiny)])
    assert res["decode_tokens_per_second"] is None  # 48 prompt tokens need two steps
    assert "Avg decode throughput" not in capsys.readouterr().out


def test_startup_phases_times_the_engine_core(tiny, capsys):
    """examples/bench/startup_phases.py: `startup`'s phases plus the engine core's load (CPU:
    no memory profile, no graphs, the interpreter compiles nothing); its patches undone."""
    import os

    from examples.bench import startup_phases
    from libvllm.engine.engine_core import engine_core
    from libvllm.engine.worker import cudagraph

    init, warmups = engine_core.EngineCore.__init__, cudagraph._WARMUP_RUNS
    env = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    res = startup_phases.main(["--input-len", "8", "--graph-warmups", "2",
                               *_engine_flags(tiny)])
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("STARTUP ") and json.loads(line[8:]) == res
    assert 0 < res["load"] <= res["engine_init_time"] + res["import_time"] + 0.01
    assert res["compiles"] == {"pool": 0, "waited": 0}
    assert "capture_model" in res and not {"profile", "precompile_capture"} & set(res)
    assert engine_core.EngineCore.__init__ is init and cudagraph._WARMUP_RUNS == warmups
    assert os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == env
