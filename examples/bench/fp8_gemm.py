"""Time the FP8 W8A8 GEMMs against bf16 on Llama-3.1-8B's and Qwen3.5-35B-A3B's linears.

    python examples/bench/fp8_gemm.py --peak-tflops 1979 [--hbm-tbps 4.8]
        [--m 1 16 ...] [--models llama qwen] [--out DIR]

Per model linear (N, K) and token count M: bf16 torch.matmul (cuBLAS); the block-FP8
Triton GEMM (kernels/fp8_block_gemm.py, [128, 128] weight blocks, its tuned config or
the default; at M = 1 its one-row GEMV, kernels/fp8_gemv.py, with "fp8_block_gemm" the
GEMM it replaces and "fp8_gemv(...)" other GEMV configs); "fp8_block+q", the same with
the activation's per-token-group quantization; "cublas_block+q", the same math on
cuBLASLt's block-scaled GEMM (kernels/fp8_scaled_mm.py fp8_block_scaled_mm, column-major
activation scales, rows padded to 4; a linear layer runs it from M = 2 where
block_scaled_mm_supported holds); and torch._scaled_mm with per-token x per-channel scales
(kernels/fp8_scaled_mm.py, row-wise, bf16 out). Each row: us per call, TFLOP/s, GB/s
(the bytes a GEMM must move: activation, weight, output) and the ratio to the
roofline max(FLOPs / peak,
bytes / bandwidth), with --peak-tflops the dense FP8 peak (bf16's is half of it) and the
bandwidth --hbm-tbps, else the device-to-device copy bandwidth measured at the start
(printed either way). Times are CUDA-graph replays (examples/bench/kernels.py gpu_time)
over enough weight copies to miss the L2. "err" is the max relative error against the bf16
matmul of the unquantized inputs (FP8's quantization error, ~1e-2). Prints a table last
(and the M = 1 GEMV against the GEMM); writes fp8_gemm.json to --out (default $OUT, else
nothing).
"""
# ruff: noqa: B023  (every lambda is timed inside the loop iteration that defines it)

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.bench.kernels import copies, copy_bandwidth, gpu_time, rel_err  # noqa: E402
from libvllm.kernels.fp8_block_gemm import get_config, w8a8_block_fp8_matmul  # noqa: E402
from libvllm.kernels.fp8_gemv import fp8_gemv_config, w8a8_block_fp8_gemv  # noqa: E402
from libvllm.kernels.fp8_quant import per_token_group_quant_fp8, scaled_fp8_quant  # noqa: E402
from libvllm.kernels.fp8_scaled_mm import (  # noqa: E402
    BLOCK_ROWS,
    block_scaled_mm_supported,
    fp8_block_scaled_mm,
    fp8_scaled_mm,
)
from libvllm.kernels.launch_configs import GemvConfig  # noqa: E402

BLOCK = [128, 128]
# (N, K) per linear; Qwen3.5-35B-A3B (hidden 2048): full attention qkv (16 gated q heads
# + 2 kv heads of 256) and o, Gated-DeltaNet in_proj_qkvz and out_proj, shared expert
MODELS = {
    "llama": {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
              "down": (4096, 14336)},
    "qwen": {"attn_qkv": (9216, 2048), "attn_o": (2048, 4096), "gdn_qkvz": (12288, 2048),
             "gdn_out": (2048, 4096), "shared_gate_up": (1024, 2048),
             "shared_down": (2048, 512)},
}
MS = [1, 16, 64, 256, 1024, 4096, 16384]
# (BN, BK, num_warps, num_stages) of the one-row GEMV timed at M = 1 beside its default
GEMV_SWEEP = [(4, 1024, 4, 2), (8, 512, 4, 2), (2, 2048, 8, 1), (16, 512, 8, 2)]


def quantize_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] bf16 -> fp8 [N, K] with [N / 128, K / 128] block scales."""
    n, k = w.shape
    wb = w.float().reshape(n // 128, 128, k // 128, 128)
    s = wb.abs().amax(dim=(1, 3)) / 448.0  # [N / 128, K / 128]
    q = (wb / s[:, None, :, None]).clamp(-448, 448).reshape(n, k).to(torch.float8_e4m3fn)
    return q, s


def quant_linear(x: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor) -> torch.Tensor:
    """What a block-FP8 linear layer runs: x [M, K] bf16 -> [M, N] bf16."""
    xq, xs = per_token_group_quant_fp8(x, BLOCK[1])
    return w8a8_block_fp8_matmul(xq, wq, xs, ws, BLOCK)


def cublas_linear(x: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor) -> torch.Tensor:
    """The same on cuBLASLt's block-scaled GEMM: x [M, K] bf16 -> [M, N] bf16."""
    xq, xs = per_token_group_quant_fp8(x, BLOCK[1], column_major_scales=True,
                                       row_multiple=BLOCK_ROWS)
    return fp8_block_scaled_mm(xq, wq, xs, ws, torch.bfloat16)[:x.shape[0]]


def bench_shape(model: str, lin: str, n: int, k: int, ms: list[int], peak: float,
                bw: float, rows: list[dict]) -> None:
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
    wq, ws = quantize_weight(w)
    w_ch = (w.float().abs().amax(dim=1, keepdim=True) / 448.0)  # [N, 1] per channel
    wq_ch = (w.float() / w_ch).clamp(-448, 448).to(torch.float8_e4m3fn)
    ws_bf16 = [w] + [w.clone() for _ in range(copies(2 * n * k) - 1)]
    ws_blk = [wq] + [wq.clone() for _ in range(copies(n * k) - 1)]
    ws_ch = [wq_ch] + [wq_ch.clone() for _ in range(copies(n * k) - 1)]
    for m in ms:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ref = x @ w.t()  # [M, N]
        xq, xs = per_token_group_quant_fp8(x, BLOCK[1])
        xq_t, xs_t = scaled_fp8_quant(x, use_per_token_if_dynamic=True)
        paths = {
            "bf16": (lambda: [x @ d.t() for d in ws_bf16], len(ws_bf16), 2, None),
            "fp8_block": (lambda: [w8a8_block_fp8_matmul(xq, d, xs, ws, BLOCK)
                                   for d in ws_blk], len(ws_blk), 1,
                          w8a8_block_fp8_matmul(xq, wq, xs, ws, BLOCK)),
            "fp8_block+q": (lambda: [quant_linear(x, d, ws) for d in ws_blk], len(ws_blk), 1,
                            quant_linear(x, wq, ws)),
            "scaled_mm_rowwise": (lambda: [fp8_scaled_mm(xq_t, d, xs_t, w_ch, torch.bfloat16)
                                           for d in ws_ch], len(ws_ch), 1,
                                  fp8_scaled_mm(xq_t, wq_ch, xs_t, w_ch, torch.bfloat16)),
        }
        if block_scaled_mm_supported(x, wq, BLOCK):
            paths["cublas_block+q"] = (lambda: [cublas_linear(x, d, ws) for d in ws_blk],
                                       len(ws_blk), 1, cublas_linear(x, wq, ws))
        if m == 1:  # the GEMM the one-row GEMV replaces, and other GEMV configs
            cfg = get_config(m, n, k, *BLOCK)
            paths["fp8_block_gemm"] = (lambda: [w8a8_block_fp8_matmul(
                xq, d, xs, ws, BLOCK, config=cfg) for d in ws_blk], len(ws_blk), 1, None)
            for gc in GEMV_SWEEP:
                paths[f"fp8_gemv{gc}"] = (lambda gc=gc: [w8a8_block_fp8_gemv(
                    xq, d, xs, ws, BLOCK, torch.bfloat16, config=GemvConfig(*gc)) for d in ws_blk],
                    len(ws_blk), 1, None)
        for path, (fn, reps, elt, out) in paths.items():
            t = gpu_time(fn) / reps
            flops = 2 * m * n * k
            nbytes = elt * (m * k + n * k) + 2 * m * n
            p = peak / 2 if path == "bf16" else peak
            roof = max(flops / p, nbytes / bw)
            r = {"model": model, "linear": lin, "N": n, "K": k, "M": m, "path": path,
                 "us": t * 1e6, "TFLOP/s": flops / t / 1e12, "GB/s": nbytes / t / 1e9,
                 "roofline_ratio": roof / t,
                 "err": None if out is None else rel_err(out, ref)}
            if path == "fp8_block":
                r["config"] = dataclasses.asdict(fp8_gemv_config(n, k, BLOCK[0]) if m == 1
                                                 else get_config(m, n, k, *BLOCK))
            rows.append(r)
            print(f"  {model:5} {lin:14} M={m:<6} {path:18} {r['us']:10.1f} us "
                  f"{r['TFLOP/s']:7.1f} TF {r['GB/s']:7.0f} GB/s {100 * r['roofline_ratio']:5.1f}%"
                  f" roof", flush=True)


def table(rows: list[dict]) -> None:
    """One line per (model, linear, M): each path's us and % of roofline."""
    paths = ["bf16", "fp8_block", "fp8_block+q", "cublas_block+q", "scaled_mm_rowwise"]
    print(f"\n{'model':6}{'linear':15}{'M':>6} " + "".join(f"{p:>24}" for p in paths)
          + f"{'block+q/bf16':>13}{'cublas/bf16':>12}")
    keys = sorted({(r["model"], r["linear"], r["M"]) for r in rows},
                  key=lambda x: (x[0], x[1], x[2]))
    by = {(r["model"], r["linear"], r["M"], r["path"]): r for r in rows}
    for key in keys:
        cells = [by.get((*key, p)) for p in paths]
        line = "".join(f"{c['us']:11.1f}us {100 * c['roofline_ratio']:5.1f}%roof" if c
                       else f"{'-':>24}" for c in cells)
        speed = [cells[0]["us"] / c["us"] if cells[0] and c else float("nan")
                 for c in (cells[2], cells[3])]
        print(f"{key[0]:6}{key[1]:15}{key[2]:>6} {line}{speed[0]:12.2f}x{speed[1]:11.2f}x")
    print("\nM=1: the GEMV (default config, best of the sweep) against the block GEMM")
    for model, lin, _ in (k for k in keys if k[2] == 1):
        one = [r for r in rows if (r["model"], r["linear"], r["M"]) == (model, lin, 1)]
        gemm = next((r for r in one if r["path"] == "fp8_block_gemm"), None)
        gemv = [r for r in one if r["path"] == "fp8_block" or r["path"].startswith("fp8_gemv")]
        if gemm and gemv:
            best = min(gemv, key=lambda r: r["us"])
            print(f"{model:6}{lin:15} gemv {gemv[0]['us']:8.1f}us "
                  f"{100 * gemv[0]['roofline_ratio']:5.1f}%roof  best {best['path']:28} "
                  f"{best['us']:8.1f}us  gemm {gemm['us']:8.1f}us "
                  f"{100 * gemm['roofline_ratio']:5.1f}%roof")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--peak-tflops", type=float, required=True,
                    help="dense FP8 peak TFLOP/s of the device (bf16: half)")
    ap.add_argument("--hbm-tbps", type=float, default=None,
                    help="HBM TB/s for the roofline (default: the measured copy bandwidth)")
    ap.add_argument("--m", type=int, nargs="*", default=MS)
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    ap.add_argument("--out", default=os.environ.get("OUT"))
    args = ap.parse_args()
    torch.manual_seed(0)
    start = time.time()
    copy_bw = copy_bandwidth()
    bw = args.hbm_tbps * 1e12 if args.hbm_tbps else copy_bw
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  triton "
          f"{__import__('triton').__version__}  copy bandwidth {copy_bw / 1e12:.2f} TB/s, "
          f"roofline at {bw / 1e12:.2f} TB/s and {args.peak_tflops:.0f} FP8 TFLOP/s",
          flush=True)
    rows: list[dict] = []
    for model in args.models:
        for lin, (n, k) in MODELS[model].items():
            bench_shape(model, lin, n, k, args.m, args.peak_tflops * 1e12, bw, rows)
            torch.cuda.empty_cache()
    table(rows)
    print(f"\n{time.time() - start:.0f} s")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                "triton": __import__("triton").__version__, "copy_tbps": copy_bw / 1e12,
                "roofline_tbps": bw / 1e12, "peak_tflops": args.peak_tflops,
                "command": " ".join(sys.argv)}
        (Path(args.out) / "fp8_gemm.json").write_text(json.dumps({"meta": meta, "rows": rows},
                                                                 indent=1))


if __name__ == "__main__":
    main()
