"""`python -m examples.bench.override <latency|throughput> [flags]`: an examples.bench
command with kernel launch configs replaced from the environment, for end-to-end sweeps
(not `startup`, whose iterations run in fresh processes).

A kernel sweep (examples/bench/kernels.py --sweep, benchmark_moe.py --gemv-sweep) times one
kernel alone, its weights often warm in L2; a decode step streams every layer's weights from
HBM with launches overlapped under PDL, and configs that won alone lost end to end (session
13, docs/BENCHMARKS.md). This runs the command in process (it adds --no-multiprocessing: an
engine-core child would import the kernels afresh) after replacing:

    BENCH_GEMV="N,K:BN,BK,WARPS,STAGES;..."  kernels/gemv.py dense_gemv_config for [N, K]
    BENCH_MOE_W13, BENCH_MOE_W2="BN,BK,WARPS,STAGES"  kernels/fused_moe_gemv.py's pair
    BENCH_DECODE_TILE=KEYS  the decode attention's KV tile (paged_attention_decode's tile_n)

    BENCH_GEMV="5120,2048:8,512,4,2" python3 -m examples.bench.override latency \\
        --model examples/bench/models/qwen3-30b-a3b --load-format dummy ...
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping


def _ints(text: str, count: int, name: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if len(values) != count or min(values) < 1:
        raise SystemExit(f"{name}: expected {count} positive integers a,b,..., got {text!r}")
    return values


def _gemv_config(text: str, name: str):
    """A GemvConfig from "BN,BK,WARPS,STAGES"; a SystemExit naming `name` if invalid."""
    from libvllm.kernels.launch_configs import GemvConfig

    try:
        return GemvConfig(*_ints(text, 4, name))
    except ValueError as e:
        raise SystemExit(f"{name}: {e}") from None


def apply(env: Mapping[str, str]) -> None:
    """Replace the config functions the BENCH_* entries of env name (the others stay)."""
    import libvllm.kernels.decode_attention as decode_attention
    import libvllm.kernels.fused_moe_gemv as fused_moe_gemv
    import libvllm.kernels.gemv as gemv

    if env.get("BENCH_GEMV"):
        shapes = {}
        for item in env["BENCH_GEMV"].split(";"):
            shape, sep, config = item.partition(":")
            if not sep:
                raise SystemExit(f"BENCH_GEMV: expected N,K:BN,BK,WARPS,STAGES, got {item!r}")
            shapes[_ints(shape, 2, "BENCH_GEMV")] = _gemv_config(config, "BENCH_GEMV")
        base_gemv = gemv.dense_gemv_config
        gemv.dense_gemv_config = lambda n, k, silu_and_mul=False: shapes.get(
            (n, k), base_gemv(n, k, silu_and_mul))
    w13, w2 = (_gemv_config(env[name], name) if env.get(name) else None
               for name in ("BENCH_MOE_W13", "BENCH_MOE_W2"))
    if w13 or w2:
        base_moe = fused_moe_gemv.fused_moe_gemv_config

        def moe_config(hidden: int, intermediate: int, top_k: int):
            a, b = base_moe(hidden, intermediate, top_k)
            return fused_moe_gemv.MoeGemvConfigs(w13 or a, w2 or b)

        fused_moe_gemv.fused_moe_gemv_config = moe_config
    if env.get("BENCH_DECODE_TILE"):
        fn = decode_attention.paged_attention_decode
        defaults = list(fn.__defaults__)
        tile = fn.__code__.co_varnames.index("tile_n") - (fn.__code__.co_argcount
                                                          - len(defaults))
        defaults[tile] = _ints(env["BENCH_DECODE_TILE"], 1, "BENCH_DECODE_TILE")[0]
        fn.__defaults__ = tuple(defaults)


def in_process(argv: list[str]) -> list[str]:
    """argv with --no-multiprocessing (a --multiprocessing request is an error here)."""
    if argv[:1] == ["startup"]:
        raise SystemExit("override: startup runs each iteration in a fresh process, which "
                         "would not see the replaced configs; use latency or throughput")
    if "--multiprocessing" in argv:
        raise SystemExit("override: the replaced configs live in this process; "
                         "drop --multiprocessing")
    return argv if "--no-multiprocessing" in argv else [*argv, "--no-multiprocessing"]


def main(argv: list[str] | None = None) -> dict:
    from examples.bench.__main__ import main as bench_main

    apply(os.environ)
    return bench_main(in_process(list(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    main()
