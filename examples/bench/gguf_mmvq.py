"""Time the int8-dot GGUF decode GEMV (kernels/gguf_mmvq.py) on Llama-3.1-8B's linear shapes.

    python examples/bench/gguf_mmvq.py [--sweep [--configs R,B,W,L ...]] [--m 1 2 4 8]
        [--types Q4_K ...] [--out DIR]

Per type (Q4_0 Q4_1 Q8_0 Q4_K Q5_K Q6_K), shape (qkv, o, gate_up, down, lm_head, v) and M: the
whole op (quantize_q8_1 + GEMV), the GEMV alone with the default config and, with --sweep,
the other configs of CONFIGS or --configs (M = 1 only); and per shape the time torch's sum
takes to read the same bytes (a streaming reference for a layer of that size). Times, bytes
and %BW as examples/bench/kernels.py (CUDA-graph replays over enough weight copies to miss
the L2; %BW counts the quantized bytes). The error is against the fp32 dequantized
reference (int8 activations: ~1e-2). Writes gguf_mmvq.json to --out (default $OUT or .).
"""
# ruff: noqa: B023  (every lambda is timed inside the loop iteration that defines it)

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

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
from libvllm.kernels.gguf_mmvq import gguf_mmvq, gguf_mmvq_q8_1, mmvq_config, quantize_q8_1  # noqa: E402
from libvllm.kernels.launch_configs import MmvqConfig  # noqa: E402

TYPES = (GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K)
_LEGACY = [(1, 8, 1), (1, 16, 1), (1, 32, 1), (1, 64, 1), (2, 32, 1), (1, 32, 2), (1, 64, 2),
           (2, 32, 2), (2, 16, 1), (1, 128, 4)]
# LAYOUT 1, 2 (kernels/gguf_mmvq_lanes.py): a lane per 4 words of a block's units; rows x blocks
# >= 8 x warps (Q4_K, Q5_K, Q6_K: 4 units a block) or 32 x warps (Q8_0, Q4_0, Q4_1)
_LANES_K = [(2, 4, 1, 1), (1, 8, 1, 1), (4, 2, 1, 1), (8, 1, 1, 1), (4, 4, 1, 1), (2, 8, 1, 1),
            (8, 2, 1, 1), (4, 4, 2, 1), (8, 2, 2, 1), (16, 1, 2, 1), (8, 4, 2, 1), (16, 2, 4, 1),
            (1, 16, 1, 1), (1, 16, 2, 1), (1, 32, 4, 1), (2, 16, 4, 1),
            (2, 4, 1, 2), (1, 8, 1, 2), (4, 4, 1, 2), (1, 16, 2, 2)]  # 2: weights past L1
_LANES_LEGACY = [(1, 32, 1, 1), (2, 16, 1, 1), (4, 8, 1, 1), (1, 64, 1, 1), (2, 32, 1, 1),
                 (4, 16, 1, 1), (8, 8, 1, 1), (1, 64, 2, 1), (2, 32, 2, 1), (1, 128, 2, 1),
                 (1, 128, 4, 1), (8, 16, 2, 1), (1, 32, 1, 2), (1, 64, 1, 2), (2, 32, 1, 2),
                 (1, 128, 4, 2)]
_K_QUANT = [(1, 2, 1), (1, 4, 1), (1, 8, 1), (2, 4, 1), (1, 4, 2), (1, 8, 2), (2, 8, 2),
            (2, 2, 1), (4, 4, 1), (1, 16, 4)]
H = LLAMA_LINEARS["o"][1]
# v: Q4_K_M's attn_v is Q6_K in some layers, its own 1024-row GEMV (not in the sums)
SHAPES = dict(LLAMA_LINEARS, lm_head=(128256, H), v=(1024, H))
PER_TOKEN = {"lm_head": 1, "v": 0}  # launches a token (32 layers for the others)
CONFIGS = {  # (rows per program, blocks per step, warps[, layout]) tried by --sweep
    GGMLType.Q4_K: _K_QUANT + _LANES_K, GGMLType.Q5_K: _K_QUANT + _LANES_K,
    GGMLType.Q6_K: _K_QUANT + _LANES_K, GGMLType.Q8_0: _LEGACY + _LANES_LEGACY,
    GGMLType.Q4_0: _LEGACY + _LANES_LEGACY, GGMLType.Q4_1: _LEGACY + _LANES_LEGACY,
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--configs", nargs="*", default=None,
                    help="with --sweep, these instead of CONFIGS: rows,blocks,warps,layout")
    ap.add_argument("--m", type=int, nargs="*", default=[1, 2, 4, 8])
    ap.add_argument("--types", nargs="*", default=[t.name for t in TYPES])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    torch.manual_seed(0)
    per_token: dict[str, float] = {}
    sweep = [tuple(int(v) for v in c.split(",")) for c in args.configs or []]  # --configs
    for qtype in (GGMLType[t] for t in args.types):
        per_token[qtype.name] = 0.0
        for lin, (n, k) in SHAPES.items():
            ws = [random_weight(qtype, n, k) for _ in range(copies(n * k // 2))]
            nbytes = ws[0].numel()
            t = gpu_time(lambda: [w.view(torch.int32).sum(dtype=torch.int32) for w in ws])
            row(f"mmvq {qtype.name} read", f"{lin} {n}x{k}", t / len(ws), nbytes,
                note="the same bytes read by torch's sum (streaming reference)")
            for m in args.m:
                x = torch.randn(m, k, dtype=BF16, device=DEV)
                ref = gguf_gemm_ref(x, ws[0], qtype)
                err = rel_err(gguf_mmvq(x, ws[0], qtype), ref)
                t = gpu_time(lambda: [gguf_mmvq(x, w, qtype) for w in ws]) / len(ws)
                row(f"mmvq {qtype.name}", f"{lin} {n}x{k} M={m}", t, nbytes, err=err,
                    note="quantize + GEMV")
                if m == 1:
                    per_token[qtype.name] += t * PER_TOKEN.get(lin, 32)
                xq8 = quantize_q8_1(x)
                out = torch.empty(m, n, dtype=BF16, device=DEV)
                configs = [None] + (sweep or CONFIGS[qtype] if args.sweep and m == 1 else [])
                for cfg in (c and MmvqConfig(*c) for c in configs):
                    t = gpu_time(lambda: [gguf_mmvq_q8_1(xq8, w, qtype, out, cfg)
                                          for w in ws]) / len(ws)
                    err = rel_err(gguf_mmvq_q8_1(xq8, ws[0], qtype, out, cfg), ref)
                    row(f"mmvq {qtype.name} GEMV", f"{lin} {n}x{k} M={m}", t, nbytes, err=err,
                        note=str(cfg) if cfg else f"default {mmvq_config(qtype, n)}")
    for name, t in per_token.items():
        print(f"  Llama-3.1-8B {name} linear layers (32 x qkv+o+gate_up+down, quantize + "
              f"GEMV, M = 1) + lm_head: {t * 1e3:.3f} ms per token")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "gguf_mmvq.json").write_text(json.dumps(
        {"rows": ROWS, "per_token_ms": {k: v * 1e3 for k, v in per_token.items()}}, indent=1))


if __name__ == "__main__":
    main()
