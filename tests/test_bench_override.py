"""examples/bench/override.py: the BENCH_* environment replaces exactly the kernel configs it
names, malformed values stop with a message, and the command runs in process. Our tool (no
upstream test): the oracles are the kernels' own config functions."""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="kernels/ need triton")

import libvllm.kernels.decode_attention as decode_attention  # noqa: E402
import libvllm.kernels.fused_moe_gemv as fused_moe_gemv  # noqa: E402
import libvllm.kernels.gemv as gemv  # noqa: E402
from examples.bench import override  # noqa: E402
from libvllm.kernels.launch_configs import GemvConfig  # noqa: E402


@pytest.fixture(autouse=True)
def _restore(monkeypatch):
    """Register the originals so that monkeypatch puts them back after each test."""
    monkeypatch.setattr(gemv, "dense_gemv_config", gemv.dense_gemv_config)
    monkeypatch.setattr(fused_moe_gemv, "fused_moe_gemv_config",
                        fused_moe_gemv.fused_moe_gemv_config)
    monkeypatch.setattr(decode_attention.paged_attention_decode, "__defaults__",
                        decode_attention.paged_attention_decode.__defaults__)


def test_gemv_configs_replaced_for_the_shapes_named_only() -> None:
    before = gemv.dense_gemv_config(4096, 4096), gemv.dense_gemv_config(14336, 4096, True)
    override.apply({"BENCH_GEMV": "5120,2048:8,512,4,2;2048,4096:4,1024,2,1"})
    assert gemv.dense_gemv_config(5120, 2048) == GemvConfig(8, 512, 4, 2)
    assert gemv.dense_gemv_config(2048, 4096) == GemvConfig(4, 1024, 2, 1)
    assert (gemv.dense_gemv_config(4096, 4096), gemv.dense_gemv_config(14336, 4096, True)) == before


def test_moe_pair_replaced_one_side_at_a_time() -> None:
    w13, w2 = fused_moe_gemv.fused_moe_gemv_config(2048, 768, 8)
    override.apply({"BENCH_MOE_W2": "1,1024,2,1"})
    assert fused_moe_gemv.fused_moe_gemv_config(2048, 768, 8) == (w13, GemvConfig(1, 1024, 2, 1))


def test_decode_tile_default_replaced() -> None:
    override.apply({"BENCH_DECODE_TILE": "128"})
    fn = decode_attention.paged_attention_decode
    names = fn.__code__.co_varnames[:fn.__code__.co_argcount]
    defaults = dict(zip(names[-len(fn.__defaults__):], fn.__defaults__))
    assert defaults["tile_n"] == 128 and defaults["num_warps"] == 4


def test_empty_environment_changes_nothing() -> None:
    config = gemv.dense_gemv_config
    override.apply({"PATH": "/bin"})
    assert gemv.dense_gemv_config is config


@pytest.mark.parametrize("env,message", [
    ({"BENCH_GEMV": "5120,2048"}, "N,K:BN,BK,WARPS,STAGES"),
    ({"BENCH_GEMV": "5120,2048:8,512,4"}, "expected 4 positive integers"),
    ({"BENCH_MOE_W13": "8,x,4,1"}, "BENCH_MOE_W13"),
    ({"BENCH_DECODE_TILE": "0"}, "expected 1 positive integers"),
])
def test_malformed_values_stop_with_a_message(env, message) -> None:
    with pytest.raises(SystemExit, match=message):
        override.apply(env)


def test_commands_run_in_process() -> None:
    assert override.in_process(["latency"]) == ["latency", "--no-multiprocessing"]
    assert override.in_process(["latency", "--no-multiprocessing"]).count(
        "--no-multiprocessing") == 1
    with pytest.raises(SystemExit, match="drop --multiprocessing"):
        override.in_process(["latency", "--multiprocessing"])
    with pytest.raises(SystemExit, match="fresh process"):
        override.in_process(["startup", "--no-multiprocessing"])
