"""Time the GDN prefill kernels: the fused recurrent one against the chunked one.

    python examples/bench/gdn_prefill.py [--tiny]

Shapes are Qwen3.5-35B-A3B's Gated DeltaNet layer (16 key / 32 value heads of 128, bf16
q/k/v, fp32 state, gates from the raw a/b projections as the layer calls them), over
batches of prompts (count x length). Prints per batch the time of
kernels/gated_delta_rule.py fused_sigmoid_gating_delta_rule and of
kernels/chunk_gated_delta_rule.py chunk_sigmoid_gating_delta_rule (mean of CUDA-event timed
calls after a warm-up) and the max abs difference of their outputs and states. --tiny runs
small shapes (on CPU: under TRITON_INTERPRET=1, a smoke test of this script).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from libvllm.kernels.chunk_gated_delta_rule import (  # noqa: E402
    chunk_sigmoid_gating_delta_rule,
    prepare_chunk_indices,
)
from libvllm.kernels.gated_delta_rule import fused_sigmoid_gating_delta_rule  # noqa: E402


def timed(fn, dev: str, reps: int) -> float:
    """Seconds per fn() call."""
    fn()
    if dev != "cuda":
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / reps


def bench(n: int, length: int, hk: int, hv: int, d: int, dev: str, dtype) -> None:
    T = n * length
    x = torch.randn(T, (2 * hk + hv) * d, device=dev, dtype=dtype)  # the conv output
    q, k, v = (t.unflatten(-1, (-1, d)) for t in x.split([hk * d, hk * d, hv * d], -1))
    b, a = (torch.randn(T, 2 * hv, device=dev, dtype=dtype) * 3).split([hv, hv], dim=-1)
    A_log, dt_bias = torch.randn(hv, device=dev), torch.randn(hv, device=dev)
    states = torch.randn(n + 1, hv, d, d, device=dev) * 0.1
    qsl = torch.arange(0, T + 1, length, dtype=torch.int32, device=dev)
    idx = torch.arange(1, n + 1, device=dev)
    init = torch.zeros(n, dtype=torch.bool, device=dev)
    res = {}
    # the chunk list is built once a step on the host (the layer's prefill_split): not timed
    chunks = torch.tensor(prepare_chunk_indices(qsl.tolist(), idx.tolist()), dtype=torch.int32,
                          device=dev).view(-1, 2)
    for name, fn, extra in (("recurrent", fused_sigmoid_gating_delta_rule, ()),
                            ("chunk", chunk_sigmoid_gating_delta_rule, (chunks,))):
        s = states.clone()  # every call starts from zero states (init False): same result

        def call(fn=fn, s=s, extra=extra):
            return fn(q, k, v, a, b, A_log, dt_bias, s, qsl, idx, init, *extra)
        res[name] = (timed(call, dev, 10), call().float(), s)
    (t_r, o_r, s_r), (t_c, o_c, s_c) = res["recurrent"], res["chunk"]
    print(f"{n:5d} x {length:5d}  recurrent {t_r * 1e3:8.3f} ms  chunk {t_c * 1e3:8.3f} ms  "
          f"x{t_r / t_c:5.1f}  max|do| {(o_r - o_c).abs().max():.2e}  "
          f"max|dS| {(s_r - s_c).abs().max():.2e}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true", help="small shapes (CPU smoke test)")
    tiny = ap.parse_args().tiny
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if tiny:
        bench(2, 70, 1, 2, 16, dev, torch.float32)
        return
    for n, length in ((1, 1024), (8, 1024), (32, 1024), (1, 8192), (64, 128), (256, 16)):
        bench(n, length, 16, 32, 128, dev, torch.bfloat16)


if __name__ == "__main__":
    main()
