"""Time the fused MoE layer and tune its launch configs on a CUDA device.

    python examples/bench/benchmark_moe.py [--model DIR] [--batch-size M ...]
        [--dtype auto|fp8_w8a8] [--tune] [--gemv-sweep] [--fp8-gemv] [--budget-s S]
        [--save-dir DIR]

Mirrors vLLM 0.33 benchmarks/kernels/benchmark_moe.py (model shapes from config.json,
the same batch sizes, one fused_experts call timed per config, the best config per batch
size written as "E=..,N=..,device_name=...json" with triton_version). Differences: the
search is a coordinate descent from the current config (the tuned file, else the default)
over upstream's parameter ranges, two rounds, so one device call of a few minutes covers
all batch sizes (upstream tries the whole product, hours on one GPU); --budget-s stops it
and keeps the tuned sizes so far, the others from the existing file. Times are CUDA-graph
replays of 16 calls with different random routings (16 x 8 experts covers Qwen3-30B-A3B's
128 once), so the selected experts' weights come from HBM as in a model step.

Without --tune it prints, per batch size, the Triton path with the config it would use,
the torch grouped-GEMM fallback (LIBVLLM_MOE_BACKEND=torch), and the bytes of distinct
expert weights the call must read, as a share of the H200's 4.28 TB/s. At the sparse
batch sizes (M * top_k * 4 <= E) the Triton path is the GEMV pair (kernels/fused_moe_gemv.py,
"path": "gemv"), and the row also times the fused_moe_kernel path it replaces
("fused_moe_kernel_us"); --tune tunes that path's configs. --gemv-sweep adds, at those
sizes, a coordinate descent over each GEMV kernel's (BN, BK, num_warps) from
fused_moe_gemv_config's and from a few seeds (GEMV_SEEDS), timing the routed kernels the
layer runs (fused_moe_gemv_w13_routed / _w2_routed, top-k in their prologue) ("gemv_sweep":
default and best, us and share of 4.28 TB/s), and times the router GEMV at M=1
(kernels/gemv.py dense_gemv on [E, hidden]; "router": dense_gemv_config's, the previous 8-row
config and a few others). At the sparse sizes each row also has "layer_us" (what FusedMoE
runs from the router logits: fused_moe_triton, routed GEMVs) and "topk_then_gemv_us"
(fused_topk, then the GEMV pair on its ids: the layer before the top-k was folded). Writes
benchmark_moe.json (and with --tune the config file) to --save-dir (default $OUT or .).
Default model: examples/bench/models/qwen3-30b-a3b (E=128, top-8, N=768, hidden 2048).
--dtype fp8_w8a8 (upstream's flag) times and tunes the experts in block FP8 ([128, 128]
scales, per-token-group activations, kernels/fused_moe.py with use_fp8_w8a8) and writes
"E=..,N=..,device_name=..,dtype=fp8_w8a8,block_shape=[128,128].json"; no torch fallback
column (it has no FP8 path).
--fp8-gemv (batch sizes <= 16 of --batch-size) instead times, on the model's experts in
block FP8 ([128, 128] scales): the bf16 GEMV pair, the FP8 GEMV pair
(kernels/fused_moe_gemv_fp8.py fused_moe_gemv_fp8: both quantizations and both GEMVs, at
every M, past the dispatch's regime too), the FP8 fused_moe_kernel path (allow_gemv=False)
and what the layer runs for FP8 experts (fused_experts_triton), prints a table and writes
benchmark_moe_fp8.json; at the sparse sizes it sweeps each FP8 GEMV kernel's (BN, BK,
num_warps) as --gemv-sweep does ("fp8_gemv_sweep").
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
import time
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.bench.kernels import gpu_time  # noqa: E402
from libvllm.engine.layers.activation import SiluAndMul  # noqa: E402
from libvllm.engine.layers.fused_moe import (  # noqa: E402
    fused_experts_grouped,
    fused_experts_triton,
    fused_moe_triton,
    fused_topk,
    get_config_file_name,
    override_config,
    try_get_optimal_moe_config,
)

BW = 4.28e12  # measured H200 copy bandwidth, B/s
BATCH_SIZES = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072,
               4096]
RANGES = {"BLOCK_SIZE_M": [16, 32, 64, 128, 256], "BLOCK_SIZE_N": [32, 64, 128, 256],
          "BLOCK_SIZE_K": [64, 128, 256], "GROUP_SIZE_M": [1, 16, 32, 64],
          "num_warps": [4, 8], "num_stages": [2, 3, 4, 5]}
ROUTINGS = 16
KEYS = list(RANGES)


def model_params(model_dir: str) -> tuple[int, int, int, int]:
    """(E, top_k, intermediate N, hidden) from a Hugging Face config.json."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    e = cfg.get("num_experts") or cfg.get("num_local_experts")
    n = cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
    return int(e), int(cfg["num_experts_per_tok"]), int(n), int(cfg["hidden_size"])


class Case:
    """Weights and ROUTINGS routings of one batch size; run() = ROUTINGS layer calls."""

    def __init__(self, m: int, e: int, topk: int, n: int, h: int, fp8: bool = False) -> None:
        self.m, self.topk = m, topk
        self.x = torch.randn(m, h, device="cuda", dtype=torch.bfloat16)
        self.w13 = torch.randn(e, 2 * n, h, device="cuda", dtype=torch.bfloat16) / h**0.5
        self.w2 = torch.randn(e, h, n, device="cuda", dtype=torch.bfloat16) / n**0.5
        self.logits = [torch.randn(m, e, device="cuda").bfloat16() for _ in range(ROUTINGS)]
        self.routes = [fused_topk(lg, topk, True) for lg in self.logits]
        # distinct experts per call, averaged: what the call must read from HBM
        distinct = sum(len(set(ids.flatten().tolist())) for _, ids in self.routes) / ROUTINGS
        self.bytes13, self.bytes2 = (distinct * w[0].numel() * 2 for w in (self.w13, self.w2))
        self.quant: dict = {}  # fused_experts_triton's FP8 arguments
        if fp8:
            (self.w13, s13), (self.w2, s2) = quantize_block_fp8(self.w13), \
                quantize_block_fp8(self.w2)
            self.quant = dict(use_fp8_w8a8=True, w1_scale=s13, w2_scale=s2,
                              block_shape=FP8_BLOCK)
            self.bytes13, self.bytes2 = self.bytes13 / 2, self.bytes2 / 2  # 1-byte weights
        self.bytes = self.bytes13 + self.bytes2
        self.sparse = m * topk * 4 <= e
        self.allow_gemv = True  # False: the fused_moe_kernel path at every M

    def run(self, experts=fused_experts_triton) -> None:
        for w, ids in self.routes:
            if experts is fused_experts_triton:
                experts(self.x, self.w13, self.w2, w, ids, SiluAndMul(),
                        allow_gemv=self.allow_gemv, **self.quant)
            else:
                experts(self.x, self.w13, self.w2, w, ids.long(), SiluAndMul())

    def layer(self, fused: bool = True) -> None:
        """What FusedMoE runs from the router logits (fused: the routed GEMVs at sparse
        sizes), or fused_topk then fused_experts_triton."""
        for lg in self.logits:
            if fused:
                fused_moe_triton(self.x, self.w13, self.w2, lg, self.topk, True, SiluAndMul())
            else:
                w, ids = fused_topk(lg, self.topk, True)
                fused_experts_triton(self.x, self.w13, self.w2, w, ids, SiluAndMul())

    def time(self, config: dict | None) -> float:
        with override_config(config):
            return gpu_time(self.run) / ROUTINGS


def valid(cfg: dict, m: int, topk: int, e: int) -> bool:
    """Skip M blocks far larger than the pairs per expert (padding only)."""
    return cfg["BLOCK_SIZE_M"] <= max(16, triton.next_power_of_2(4 * m * topk // e))


def tune_one(case: Case, start: dict, e: int, deadline: float) -> tuple[dict, float]:
    best = {k: start[k] for k in KEYS}
    ranges = RANGES
    if case.quant:  # the block-FP8 launch clamps BLOCK_SIZE_K to block_k: search only those
        ranges = {**RANGES, "BLOCK_SIZE_K": [k for k in RANGES["BLOCK_SIZE_K"]
                                             if k <= FP8_BLOCK[1]]}
        best["BLOCK_SIZE_K"] = min(best["BLOCK_SIZE_K"], FP8_BLOCK[1])
    best_t = case.time(best)
    for _ in range(2):
        for key in KEYS:
            for v in ranges[key]:
                cand = {**best, key: v}
                if cand == best or not valid(cand, case.m, case.topk, e) \
                        or time.time() > deadline:
                    continue
                try:
                    t = case.time(cand)
                except Exception as exc:  # out of shared memory / resources: skip it
                    print(f"    skip {cand}: {type(exc).__name__}", flush=True)
                    continue
                if t < best_t:
                    best, best_t = cand, t
    return best, best_t


GEMV_RANGES = [[1, 2, 4, 8, 16], [128, 256, 512, 1024], [1, 2, 4, 8]]  # BN, BK, warps
# more starting points per kernel (BN, BK, warps, stages): w2 with one row of H per
# program (2048 programs at M=1) or whole rows of I in one tile (BK >= I: every weight
# load issued before the PDL wait), w13 with 2 or 8 rows or one warp (its top-k prologue
# then has no cross-warp barriers)
GEMV_SEEDS = {"w13": [(2, 512, 2, 1), (8, 128, 2, 1), (4, 512, 4, 1), (2, 256, 1, 1)],
              "w2": [(1, 1024, 4, 1), (1, 512, 2, 1), (2, 512, 4, 1), (4, 256, 4, 1),
                     (1, 256, 1, 1), (2, 1024, 8, 1)]}
# (num_stages is not swept: without tl.dot nothing is pipelined, the code is the same)
GEMV_MAX_ACC = 128  # fp32 accumulator values a thread may hold (more spills)


def _timer(fn):
    """cfg -> seconds per routing of fn(cfg), each config timed once (inf if it fails)."""
    cache: dict[tuple, float] = {}

    def timed(cfg: tuple) -> float:
        if cfg not in cache:
            try:
                cache[cfg] = gpu_time(functools.partial(fn, cfg)) / ROUTINGS
            except Exception as exc:  # out of resources: skip it
                print(f"    skip {cfg}: {type(exc).__name__}", flush=True)
                cache[cfg] = float("inf")
        return cache[cfg]
    return timed


def _descend(timed, start: tuple, rows: int, deadline: float) -> tuple[tuple, float]:
    """Two coordinate-descent rounds over GEMV_RANGES from `start`: (best, seconds)."""
    best, best_t = start, timed(start)
    for _ in range(2):
        for idx, values in enumerate(GEMV_RANGES):
            for v in values:
                cand = best[:idx] + (v,) + best[idx + 1:]
                if cand == best or rows * cand[0] * cand[1] > GEMV_MAX_ACC * 32 * cand[2] \
                        or time.time() > deadline:
                    continue
                if (t := timed(cand)) < best_t:
                    best, best_t = cand, t
    return best, best_t


def sweep_gemv(case: Case, deadline: float) -> dict:
    """Each routed GEMV kernel alone over the case's routings: fused_moe_gemv_config's
    config and the best descent from it and from each of GEMV_SEEDS."""
    from libvllm.kernels.fused_moe_gemv import (
        fused_moe_gemv_config,
        fused_moe_gemv_w2_routed,
        fused_moe_gemv_w13_routed,
    )
    from libvllm.kernels.launch_configs import GemvConfig

    h, i, k = case.x.shape[1], case.w2.shape[2], case.topk
    acts = [fused_moe_gemv_w13_routed(case.x, case.w13, lg, k) for lg in case.logits]
    kp = triton.next_power_of_2(k)

    def w13(cfg):
        for lg in case.logits:
            fused_moe_gemv_w13_routed(case.x, case.w13, lg, k, GemvConfig(*cfg))

    def w2(cfg):
        for act, lg in zip(acts, case.logits, strict=True):
            fused_moe_gemv_w2_routed(act, case.w2, lg, k, True, GemvConfig(*cfg))

    result = {}
    defaults = [dataclasses.astuple(c) for c in fused_moe_gemv_config(h, i, k)]
    for name, fn, start, rows, nbytes in (("w13", w13, defaults[0], 2, case.bytes13),
                                          ("w2", w2, defaults[1], kp, case.bytes2)):
        timed = _timer(fn)
        best, best_t = start, timed(start)
        for seed in [start] + GEMV_SEEDS[name]:
            cand, t = _descend(timed, seed, rows, deadline)
            if t < best_t:
                best, best_t = cand, t
        result[name] = {"default": start, "default_us": timed(start) * 1e6, "best": best,
                        "best_us": best_t * 1e6, "best_pct_bw": 100 * nbytes / best_t / BW}
    return result


FP8_BLOCK = [128, 128]


def quantize_block_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[E, N, K] bf16 (N, K multiples of 128) -> fp8 [E, N, K] with [E, N / 128, K / 128]
    block scales, as a block-FP8 checkpoint's weight_scale_inv."""
    e, n, k = w.shape
    wb = w.float().reshape(e, n // 128, 128, k // 128, 128)
    s = wb.abs().amax(dim=(2, 4)).clamp(min=1e-12) / 448.0  # [E, N / 128, K / 128]
    q = (wb / s[:, :, None, :, None]).clamp(-448, 448).reshape(e, n, k)
    return q.to(torch.float8_e4m3fn), s


def compare_fp8(case: Case, deadline: float) -> dict:
    """One batch size's row of --fp8-gemv: us per call of each path, the FP8 GEMV's share of
    4.28 TB/s (half the bf16 bytes plus scales) and, at sparse sizes, its kernels' sweep."""
    from libvllm.kernels.fp8_quant import per_token_group_quant_fp8
    from libvllm.kernels.fused_moe_gemv import fused_moe_gemv_w2, fused_moe_gemv_w13
    from libvllm.kernels.fused_moe_gemv_fp8 import (
        fused_moe_gemv_fp8,
        fused_moe_gemv_fp8_config,
        fused_moe_gemv_fp8_w2,
        fused_moe_gemv_fp8_w13,
    )
    from libvllm.kernels.launch_configs import GemvConfig

    (w13, s13), (w2, s2) = quantize_block_fp8(case.w13), quantize_block_fp8(case.w2)
    fp8 = dict(use_fp8_w8a8=True, w1_scale=s13, w2_scale=s2, block_shape=FP8_BLOCK)

    def bf16_gemv():
        for w, ids in case.routes:
            fused_moe_gemv_w2(fused_moe_gemv_w13(case.x, case.w13, ids), case.w2, w, ids)

    def fp8_gemv():
        for w, ids in case.routes:
            fused_moe_gemv_fp8(case.x, w13, s13, w2, s2, w, ids, FP8_BLOCK)

    def fp8_path(allow_gemv: bool):
        for w, ids in case.routes:
            fused_experts_triton(case.x, w13, w2, w, ids, SiluAndMul(), allow_gemv=allow_gemv,
                                 **fp8)

    us = {name: gpu_time(fn) / ROUTINGS * 1e6 for name, fn in (
        ("bf16_gemv_us", bf16_gemv), ("fp8_gemv_us", fp8_gemv),
        ("fp8_gemm_us", functools.partial(fp8_path, False)),
        ("fp8_layer_us", functools.partial(fp8_path, True)))}
    fp8_bytes = case.bytes / 2 * (1 + 4 / 128**2)  # 1-byte weights, an fp32 scale a block
    row = {"M": case.m, "sparse": case.sparse, **us,
           "fp8_gemv_pct_bw": 100 * fp8_bytes / (us["fp8_gemv_us"] * 1e-6) / BW,
           "fp8_gemv_vs_bf16_gemv": us["bf16_gemv_us"] / us["fp8_gemv_us"],
           "fp8_gemv_vs_fp8_gemm": us["fp8_gemm_us"] / us["fp8_gemv_us"]}
    if not case.sparse:
        return row
    h, i, k = case.x.shape[1], case.w2.shape[2], case.topk
    xq = per_token_group_quant_fp8(case.x, FP8_BLOCK[1])
    acts = [per_token_group_quant_fp8(fused_moe_gemv_fp8_w13(*xq, w13, s13, ids, FP8_BLOCK,
                                                             torch.bfloat16), FP8_BLOCK[1])
            for _, ids in case.routes]

    def k13(cfg):
        for _, ids in case.routes:
            fused_moe_gemv_fp8_w13(*xq, w13, s13, ids, FP8_BLOCK, torch.bfloat16,
                                   GemvConfig(*cfg))

    def k2(cfg):
        for (w, ids), act in zip(case.routes, acts, strict=True):
            fused_moe_gemv_fp8_w2(*act, w2, s2, w, ids, FP8_BLOCK, torch.bfloat16,
                                  GemvConfig(*cfg))

    sweep = {}
    defaults = [dataclasses.astuple(c) for c in fused_moe_gemv_fp8_config(h, i, k, 128)]
    for name, fn, start, rows in (("w13", k13, defaults[0], 2),
                                  ("w2", k2, defaults[1], triton.next_power_of_2(k))):
        timed = _timer(fn)
        best, best_t = _descend(timed, start, rows, deadline)
        sweep[name] = {"default": start, "default_us": timed(start) * 1e6, "best": best,
                       "best_us": best_t * 1e6}
    row["fp8_gemv_sweep"] = sweep
    return row


def print_fp8_table(rows: list[dict]) -> None:
    cols = ["M", "sparse", "bf16_gemv_us", "fp8_gemv_us", "fp8_gemm_us", "fp8_layer_us",
            "fp8_gemv_pct_bw", "fp8_gemv_vs_bf16_gemv", "fp8_gemv_vs_fp8_gemm"]
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(f"{r[c]:.2f}" if isinstance(r[c], float) else str(r[c])
                         for c in cols))
    for r in rows:
        for name, sw in r.get("fp8_gemv_sweep", {}).items():
            print(f"M={r['M']} fp8 {name}: default {sw['default']} {sw['default_us']:.2f} us, "
                  f"best {sw['best']} {sw['best_us']:.2f} us")


def main_fp8(args, e: int, topk: int, n: int, h: int, start: float) -> None:
    rows = []
    for m in [m for m in args.batch_size if m <= 16]:
        case = Case(m, e, topk, n, h)
        rows.append(compare_fp8(case, start + args.budget_s))
        print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v)
                          for k, v in rows[-1].items()}), flush=True)
        del case
    print_fp8_table(rows)
    out = Path(args.save_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "benchmark_moe_fp8.json").write_text(json.dumps(
        {"device": torch.cuda.get_device_name(), "triton": triton.__version__, "E": e,
         "top_k": topk, "N": n, "hidden": h, "rows": rows}, indent=1))


ROUTER_CONFIGS = [(8, 512, 8, 2), (1, 1024, 4, 2), (1, 2048, 8, 1), (2, 1024, 4, 2),
                  (1, 512, 2, 2), (4, 512, 4, 2)]  # the first: the n < k rule's


def time_router(e: int, h: int, sweep: bool) -> dict:
    """The router GEMV at M=1 (dense_gemv on [E, hidden] bf16; 192 weight copies so they
    come from HBM as in a model step): dense_gemv_config's config, with sweep also
    ROUTER_CONFIGS."""
    from libvllm.kernels.gemv import dense_gemv, dense_gemv_config
    from libvllm.kernels.launch_configs import GemvConfig

    x = torch.randn(1, h, device="cuda", dtype=torch.bfloat16)
    ws = [torch.randn(e, h, device="cuda", dtype=torch.bfloat16) for _ in range(192)]
    default = dataclasses.astuple(dense_gemv_config(e, h))
    out = {"default": default}
    for cfg in [default] + (ROUTER_CONFIGS if sweep else []):
        t = gpu_time(lambda cfg=cfg: [dense_gemv(x, w, config=GemvConfig(*cfg))
                                      for w in ws]) / len(ws)
        out[str(cfg)] = round(t * 1e6, 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(Path(__file__).parent / "models/qwen3-30b-a3b"))
    ap.add_argument("--batch-size", type=int, nargs="+", default=BATCH_SIZES)
    ap.add_argument("--tune", action="store_true")
    ap.add_argument("--gemv-sweep", action="store_true")
    ap.add_argument("--fp8-gemv", action="store_true")
    ap.add_argument("--dtype", choices=["auto", "fp8_w8a8"], default="auto")
    ap.add_argument("--budget-s", type=float, default=480.0)
    ap.add_argument("--save-dir", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    start = time.time()
    e, topk, n, h = model_params(args.model)
    torch.manual_seed(0)
    print(f"device {torch.cuda.get_device_name()}  triton {triton.__version__}  "
          f"E={e} top_k={topk} N={n} hidden={h}", flush=True)
    if args.fp8_gemv:
        main_fp8(args, e, topk, n, h, start)
        return
    rows, tuned = [], {}
    router = time_router(e, h, args.gemv_sweep)
    print(json.dumps({"router_M1_us": router}), flush=True)
    dtype, block = (None, None) if args.dtype == "auto" else (args.dtype, FP8_BLOCK)
    for m in args.batch_size:
        case = Case(m, e, topk, n, h, fp8=dtype is not None)
        cfg = try_get_optimal_moe_config(tuple(case.w13.shape), tuple(case.w2.shape), topk,
                                         dtype, m, block)
        t = case.time(cfg)
        row = {"M": m, "triton_us": t * 1e6, "pct_bw": 100 * case.bytes / t / BW,
               "weight_MB": case.bytes / 1e6, "config": cfg,
               "path": "gemv" if case.sparse else "fused_moe_kernel"}
        deadline = start + args.budget_s
        if case.sparse and not dtype:
            row["layer_us"] = gpu_time(case.layer) / ROUTINGS * 1e6
            row["topk_then_gemv_us"] = gpu_time(
                functools.partial(case.layer, False)) / ROUTINGS * 1e6
        if case.sparse:
            case.allow_gemv = False  # from here on: the fused_moe_kernel path (what --tune tunes)
            row["fused_moe_kernel_us"] = case.time(cfg) * 1e6
            if args.gemv_sweep and not dtype:
                row["gemv_sweep"] = sweep_gemv(case, deadline)
        if args.tune:
            best, best_t = tune_one(case, cfg, e, deadline)
            tuned[m] = best
            row.update(tuned_us=best_t * 1e6, tuned_pct_bw=100 * case.bytes / best_t / BW,
                       tuned_config=best)
        elif not dtype:
            t_torch = gpu_time(functools.partial(case.run, fused_experts_grouped)) / ROUTINGS
            row["torch_grouped_us"] = t_torch * 1e6
        rows.append(row)
        print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v)
                          for k, v in row.items()}), flush=True)
        del case
    out = Path(args.save_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "benchmark_moe.json").write_text(json.dumps(
        {"device": torch.cuda.get_device_name(), "triton": triton.__version__,
         "E": e, "top_k": topk, "N": n, "hidden": h, "dtype": args.dtype,
         "router_M1_us": router, "rows": rows,
         "seconds": time.time() - start}, indent=1))
    if tuned:
        save_configs(tuned, e, n, out, dtype, block)


def save_configs(tuned: dict[int, dict], e: int, n: int, out: Path, dtype: str | None,
                 block: list[int] | None) -> None:
    """Tuned sizes over the shipped file's entries for the others; upstream's layout."""
    from libvllm.engine.layers.fused_moe.config import CONFIG_DIR

    name = get_config_file_name(e, n, dtype, block_shape=block)
    merged: dict[int, dict] = {}
    shipped = Path(CONFIG_DIR) / name
    if shipped.exists():
        old = json.loads(shipped.read_text())
        old.pop("triton_version", None)
        merged = {int(k): v for k, v in old.items()}
    merged.update(tuned)
    body = {"triton_version": triton.__version__,
            **{str(m): {k: merged[m][k] for k in KEYS} for m in sorted(merged)}}
    (out / name).write_text(json.dumps(body, indent=4) + "\n")
    print(f"wrote {out / name}", flush=True)


if __name__ == "__main__":
    main()
