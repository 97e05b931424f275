"""Time the GGUF matmul paths past the decode GEMV on Llama-3.1-8B's linear shapes.

    python examples/bench/gguf_gemm.py [--sweep] [--dequant-sweep] [--m 9 16 ...]
        [--types Q4_K ...] [--out DIR]

Per type, shape (qkv, o, gate_up, down, lm_head) and token count M, every path that can run:
the dispatch kernels/gguf_gemm.py takes (`gguf_gemm`), the word-load tile GEMM
(kernels/gguf_kquant_mmq.py, Q4_K / Q6_K; --sweep adds KQUANT_SWEEP's configs), the byte-tile
GEMM (`gguf_mmq`, M <= 64), dequantize + cuBLAS, and bf16 cuBLAS on the dequantized weights
(what the bf16 model pays: the bar for a GGUF model's offline throughput); and dequantize alone
(M = 0: the byte-tile kernel against kquant_dequantize; --dequant-sweep adds DEQUANT_SWEEP's
configs). Then, per type and M, the sum over one layer's four linears of each path: where the
tile GEMM's sum drops under dequantize + cuBLAS is the crossover for gguf_gemm's dispatch.
Times, bytes and %BW as examples/bench/kernels.py (CUDA-graph replays over enough weight
copies to miss the L2; %BW counts the quantized bytes, plus the bf16 written for dequantize
alone). Writes gguf_gemm.json to --out (default $OUT or .).
"""
# ruff: noqa: B023  (every lambda is timed inside the loop iteration that defines it)

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.bench.kernels import (  # noqa: E402
    BF16,
    DEV,
    LLAMA_LINEARS,
    ROWS,
    copies,
    gguf_gemm_ref,
    gpu_time,
    random_weight,
    rel_err,
    row,
)
from libvllm.engine.gguf.constants import GGMLType  # noqa: E402
from libvllm.engine.gguf.dequant import dequantize_rows  # noqa: E402
from libvllm.kernels import gguf_gemm as gg  # noqa: E402
from libvllm.kernels.gguf_kquant_mmq import (  # noqa: E402
    KQUANT_MMQ_TYPES,
    kquant_config,
    kquant_dequantize,
    kquant_mmq,
)
from libvllm.kernels.launch_configs import GgufBlocksConfig, KquantMmqConfig  # noqa: E402

H = LLAMA_LINEARS["o"][1]
SHAPES = dict(LLAMA_LINEARS, lm_head=(128256, H))
# (BLOCK_N, BLOCK_M, warps, stages, splits): more stages, splits and 32-row tiles try for
# more bytes in flight
KQUANT_SWEEP = [(64, 16, 4, 2, 1), (64, 32, 4, 3, 1), (64, 32, 4, 4, 1), (64, 32, 4, 5, 1),
                (64, 32, 4, 3, 2), (64, 32, 4, 3, 4), (64, 32, 4, 4, 2), (64, 32, 4, 4, 4),
                (64, 16, 4, 4, 4), (64, 32, 8, 3, 2), (64, 64, 4, 3, 1), (64, 64, 4, 4, 2),
                (32, 32, 4, 3, 1), (32, 32, 4, 4, 2), (32, 16, 2, 4, 2), (128, 128, 8, 2, 1),
                (128, 128, 8, 3, 1), (64, 128, 4, 3, 1)]
# kquant_dequantize (BLOCK_N rows, super-blocks, warps) a program
DEQUANT_SWEEP = [(8, 1, 1), (8, 2, 2), (16, 1, 2), (16, 2, 4), (16, 4, 4), (32, 1, 4),
                 (32, 2, 4), (32, 2, 8), (64, 1, 4), (64, 1, 8), (16, 16, 4), (4, 4, 1)]


def time_dequantize(qtype: GGMLType, lin: str, ws: list, dense: torch.Tensor, sweep: bool,
                    times: dict) -> None:
    """Dequantize alone (M = 0 in `times`): the byte-tile kernel of gguf_gemm.py against
    kquant_dequantize's configs; bytes moved = the blocks read + the bf16 written."""
    n, k = dense.shape
    paths = {"dequant tiles": lambda w: gg.gguf_dequantize(w, qtype, BF16,
                                                           GgufBlocksConfig(8, 1, 1))}
    if qtype in KQUANT_MMQ_TYPES:
        for cfg in [None] + (DEQUANT_SWEEP if sweep else []):
            paths[f"dequant words {cfg or 'default'}"] = \
                lambda w, c=cfg: kquant_dequantize(w, qtype, BF16, c and GgufBlocksConfig(*c))
    for path, fn in paths.items():
        t = gpu_time(lambda: [fn(w) for w in ws]) / len(ws)
        times[path, 0] = t
        row(f"gguf {qtype.name}", f"{lin} {n}x{k} dequantize", t, ws[0].numel() + 2 * n * k,
            err=rel_err(fn(ws[0]), dense), note=path)


def time_paths(qtype: GGMLType, lin: str, n: int, k: int, ms: list[int], sweep: bool,
               dequant_sweep: bool) -> dict:
    """{(path, M): seconds} for one shape; also prints and records each row."""
    ws = [random_weight(qtype, n, k) for _ in range(copies(n * k // 2))]
    dense = dequantize_rows(ws[0], qtype, torch.float32).to(BF16)  # [N, K]
    times = {}
    time_dequantize(qtype, lin, ws, dense, dequant_sweep, times)
    for m in ms:
        x = torch.randn(m, k, dtype=BF16, device=DEV)
        ref = gguf_gemm_ref(x.float(), ws[0], qtype)
        paths = {"gguf_gemm": lambda w: gg.gguf_gemm(x, w, qtype),
                 "dequant+cuBLAS": lambda w: x @ gg.gguf_dequantize(w, qtype, BF16).T}
        if qtype in KQUANT_MMQ_TYPES:
            for cfg in [kquant_config(m, n)] + [KquantMmqConfig(*c)
                                                for c in (KQUANT_SWEEP if sweep else [])]:
                paths[f"kquant_mmq {cfg}"] = lambda w, c=cfg: kquant_mmq(x, w, qtype, c)
        if m <= 64:
            paths["mmq"] = lambda w: gg.gguf_mmq(x, w, qtype)
        for path, fn in paths.items():
            try:
                t = gpu_time(lambda: [fn(w) for w in ws]) / len(ws)
            except triton.runtime.errors.OutOfResources as e:  # a sweep config too large
                print(f"  {qtype.name} {lin} M={m} {path}: skipped ({e})", flush=True)
                continue
            times[path, m] = t
            row(f"gguf {qtype.name}", f"{lin} {n}x{k} M={m}", t, ws[0].numel(), 2 * m * n * k,
                err=rel_err(fn(ws[0]), ref), note=path)
        t = gpu_time(lambda: x @ dense.T)
        times["bf16 cuBLAS", m] = t
        row(f"gguf {qtype.name}", f"{lin} {n}x{k} M={m}", t, dense.numel() * 2, 2 * m * n * k,
            note="bf16 cuBLAS")
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--dequant-sweep", action="store_true")
    ap.add_argument("--m", type=int, nargs="*", default=[9, 16, 32, 64, 128, 256, 512])
    ap.add_argument("--types", nargs="*", default=["Q4_K", "Q6_K", "Q8_0"])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    torch.manual_seed(0)
    layer: dict[tuple[str, str, int], float] = {}  # (type, path, M) -> sum over qkv/o/gate_up/down
    Path(args.out).mkdir(parents=True, exist_ok=True)
    for qtype in (GGMLType[t] for t in args.types):
        for lin, (n, k) in SHAPES.items():
            times = time_paths(qtype, lin, n, k, args.m, args.sweep, args.dequant_sweep)
            for (path, m), t in times.items():
                if lin in LLAMA_LINEARS:
                    key = (qtype.name, path, m)
                    layer[key] = layer.get(key, 0.0) + t
            (Path(args.out) / "gguf_gemm.json").write_text(json.dumps(  # kept if cut off
                {"rows": ROWS, "layer_us": [[*k, v * 1e6] for k, v in layer.items()]}, indent=1))
    print("\nOne layer's four linears (us), per type, path and M:")
    for (name, path, m), t in sorted(layer.items()):
        print(f"  {name:<5} M={m:<5} {path:<34} {t * 1e6:9.1f}")


if __name__ == "__main__":
    main()
