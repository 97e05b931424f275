"""Check every Triton kernel against its torch reference and time it on a CUDA device.

    python examples/bench/kernels.py [--sweep [SECTION ...]] [--only SECTION ...] [--out DIR]

Shapes are Llama-3.1-8B's (hidden 4096, 32 q / 8 kv heads of 128, MLP 14336, bf16
activations, block size 16); section moe takes Qwen3-30B-A3B's (top-8 pairs). Times are
CUDA-graph replays (no launch overhead) over enough distinct input copies that the data does
not sit in the 50 MB L2, as a model's layers do not. Each row: time per call, bytes moved or
FLOPs, the ratio to the H200's measured ceilings (4.28 TB/s copy, 799 TFLOP/s bf16;
docs/BENCHMARKS.md), and the max relative error against the reference. --sweep also
times other launch configs of the attention and GEMV kernels (sections: dense qkv_rope
decode prefill unified gguf); the GGUF matmuls past the GEMV are examples/bench/gguf_gemm.py.
Prints a table last; writes kernels.json to --out (default $OUT or .).
"""
# ruff: noqa: B023  (every lambda is timed inside the loop iteration that defines it)

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from libvllm.engine.gguf.constants import GGML_TYPE_TRAITS, GGMLType  # noqa: E402
from libvllm.engine.gguf.dequant import dequantize_rows as gguf_dequantize_ref  # noqa: E402
from libvllm.kernels import gguf_gemm as gg  # noqa: E402
from libvllm.kernels.activation import silu_and_mul, silu_and_mul_ref  # noqa: E402
from libvllm.kernels.decode_attention import (  # noqa: E402
    paged_attention_decode,
    paged_attention_decode_ref,
)
from libvllm.kernels.gemv import dense_gemv, dense_gemv_config, dense_gemv_ref  # noqa: E402
from libvllm.kernels.gemv_rope_cache import qkv_gemv_rope_cache, qkv_gemv_rope_cache_ref  # noqa: E402
from libvllm.kernels.launch_configs import GemvConfig, GgufBlocksConfig  # noqa: E402
from libvllm.kernels.moe_sum import moe_sum  # noqa: E402
from libvllm.kernels.paged_attention import (  # noqa: E402
    paged_attention_prefill,
    paged_attention_prefill_ref,
)
from libvllm.kernels.reshape_and_cache import reshape_and_cache, reshape_and_cache_ref  # noqa: E402
from libvllm.kernels.rms_norm import fused_add_rms_norm, rms_norm_ref  # noqa: E402
from libvllm.kernels.rotary import rotary_embedding, rotary_embedding_ref  # noqa: E402
from libvllm.kernels.rotary_cache import (  # noqa: E402
    rotary_embedding_and_cache,
    rotary_embedding_and_cache_ref,
)

BW, PEAK = 4.28e12, 799e12  # measured H200 ceilings: copy B/s, bf16 FLOP/s
H, NQ, NKV, HD, FF, BS = 4096, 32, 8, 128, 14336, 16
L2_BYTES = 256 << 20  # spread each timing over at least this many bytes of inputs
BF16 = torch.bfloat16
DEV = "cuda"
ROWS: list[dict] = []


def gpu_time(fn) -> float:
    """Seconds per fn() call, from CUDA-graph replays (fn may launch several kernels)."""
    fn()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    reps, g = 1, None
    for _ in range(2):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(reps):
                fn()
        times = []
        for _ in range(7):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        t = sorted(times)[3] / reps
        if reps > 1 or t * reps > 2e-3:
            return t
        reps = max(1, min(200, math.ceil(2e-3 / t)))
    return t


def copy_bandwidth() -> float:
    """Bytes/s of a 1 GiB device-to-device copy (read + write counted): the bandwidth the
    benchmarks' memory-bound rooflines use on the GPU they run on."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() / gpu_time(lambda: dst.copy_(src))


def copies(nbytes: int) -> int:
    return max(1, min(16, math.ceil(L2_BYTES / max(nbytes, 1))))


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30))


def row(kernel: str, shape: str, t: float, nbytes: float = 0, flops: float = 0,
        err: float | None = None, note: str = "") -> None:
    r = {"kernel": kernel, "shape": shape, "us": t * 1e6, "GB/s": nbytes / t / 1e9,
         "pct_bw": 100 * nbytes / t / BW, "TFLOP/s": flops / t / 1e12,
         "pct_peak": 100 * flops / t / PEAK, "max_rel_err": err, "note": note}
    ROWS.append(r)
    print(f"  {kernel:<22} {shape:<34} {r['us']:9.2f} us  {r['GB/s']:7.0f} GB/s "
          f"{r['pct_bw']:5.1f}%  {r['TFLOP/s']:6.1f} TF {r['pct_peak']:5.1f}%  "
          f"err {err if err is not None else float('nan'):.1e} {note}", flush=True)


def bench_small() -> None:
    for t in (1, 256, 8192):
        xs = [torch.randn(t, H, dtype=BF16, device=DEV) for _ in range(copies(4 * t * H * 2))]
        res = [torch.randn_like(x) for x in xs]
        w = torch.randn(H, dtype=BF16, device=DEV)
        ref, ref_res = rms_norm_ref(xs[0], w, 1e-5, res[0])
        x0, r0 = xs[0].clone(), res[0].clone()
        fused_add_rms_norm(x0, r0, w, 1e-5)
        err = max(rel_err(x0, ref), rel_err(r0, ref_res))
        tt = gpu_time(lambda: [fused_add_rms_norm(x, r, w, 1e-5) for x, r in zip(xs, res)])
        row("fused_add_rms_norm", f"T={t} H={H}", tt / len(xs), 4 * t * H * 2, err=err)

        gu = [torch.randn(t, 2 * FF, dtype=BF16, device=DEV) for _ in range(copies(6 * t * FF))]
        err = rel_err(silu_and_mul(gu[0]), silu_and_mul_ref(gu[0]))
        tt = gpu_time(lambda: [silu_and_mul(x) for x in gu])
        row("silu_and_mul", f"T={t} d={FF}", tt / len(gu), 6 * t * FF, err=err)

        nb = 2 * t * (NQ + NKV) * HD * 2
        qk = [torch.randn(t, (NQ + NKV) * HD, dtype=BF16, device=DEV) for _ in range(copies(nb))]
        table = torch.randn(131072, HD, device=DEV)
        pos = torch.randint(0, 131072, (t,), device=DEV)
        q0, k0 = qk[0][:, : NQ * HD].clone(), qk[0][:, NQ * HD :].clone()
        rq, rk = rotary_embedding_ref(pos, q0, k0, table, HD)
        rotary_embedding(pos, q0, k0, table, HD)
        err = max(rel_err(q0, rq), rel_err(k0, rk))
        tt = gpu_time(lambda: [rotary_embedding(pos, x[:, : NQ * HD], x[:, NQ * HD :], table, HD)
                               for x in qk])
        row("rotary_embedding", f"T={t} q={NQ}x{HD} k={NKV}x{HD}", tt / len(qk), nb, err=err)

        kv = torch.zeros(2, 8192 + t // BS + 1, BS, NKV, HD, dtype=BF16, device=DEV)
        k = torch.randn(t, NKV, HD, dtype=BF16, device=DEV)
        v = torch.randn_like(k)
        slots = torch.randperm(kv.shape[1] * BS, device=DEV)[:t]
        ref_kv = kv.clone()
        reshape_and_cache_ref(k, v, ref_kv, slots)
        reshape_and_cache(k, v, kv, slots)
        err = float((kv != ref_kv).sum())
        tt = gpu_time(lambda: reshape_and_cache(k, v, kv, slots))
        row("reshape_and_cache", f"T={t} kv={NKV}x{HD}", tt, 4 * t * NKV * HD * 2, err=err,
            note="err = mismatched elements")

        # RoPE fused with the cache write: q in place, rotated k and v to the cache
        qkv = torch.randn(t, (NQ + 2 * NKV) * HD, dtype=BF16, device=DEV)
        q, kk, vv = qkv.split([NQ * HD, NKV * HD, NKV * HD], dim=-1)
        ref_kv = kv.clone()
        ref_q = rotary_embedding_and_cache_ref(pos, q.clone(), kk, vv, table, HD, ref_kv, slots)
        q0 = q.clone()
        rotary_embedding_and_cache(pos, q0, kk, vv, table, HD, kv, slots)
        err = max(rel_err(q0, ref_q), rel_err(kv, ref_kv))
        tt = gpu_time(lambda: rotary_embedding_and_cache(pos, q, kk, vv, table, HD, kv, slots))
        row("rotary_embedding_and_cache", f"T={t} q={NQ}x{HD} kv={NKV}x{HD}", tt,
            2 * t * NQ * HD * 2 + 4 * t * NKV * HD * 2, err=err,
            note="vs rotary_embedding + reshape_and_cache above")

        # with Qwen3's per-head q/k RMSNorm folded in (QK_NORM)
        qw = torch.rand(HD, dtype=BF16, device=DEV) + 0.5
        kw = torch.rand_like(qw) + 0.5
        ref_kv = kv.clone()
        ref_q = rotary_embedding_and_cache_ref(pos, q.clone(), kk, vv, table, HD, ref_kv, slots,
                                               qw, kw)
        q0 = q.clone()
        rotary_embedding_and_cache(pos, q0, kk, vv, table, HD, kv, slots, qw, kw)
        err = max(rel_err(q0, ref_q), rel_err(kv, ref_kv))
        tt = gpu_time(lambda: rotary_embedding_and_cache(pos, q, kk, vv, table, HD, kv, slots,
                                                         qw, kw))
        row("rotary_embedding_and_cache_qk_norm", f"T={t} q={NQ}x{HD} kv={NKV}x{HD}", tt,
            2 * t * NQ * HD * 2 + 4 * t * NKV * HD * 2, err=err,
            note="vs 2 rms_norm launches + rotary_embedding_and_cache above")


def bench_dense(sweep: bool) -> None:
    """cuBLAS bf16 GEMV/GEMM (F.linear) on Llama-3.1-8B's weights at decode batch sizes and at
    the token counts of offline steps (a 1,024-request decode step, a 16,384-token prefill
    step: what docs/BENCHMARKS.md's GEMM share of 1000 x (1024, 128) is made of), and
    at M=1 kernels/gemv.py dense_gemv (what the layers run for one row on CUDA; the gate_up
    projection with SiLU-and-mul in its epilogue, as the MLP runs it). --sweep dense also times the
    GEMV's other launch configs (BN, BK, num_warps, num_stages)."""
    shapes = {"qkv": (6144, H, False), "o": (H, H, False), "gate_up": (2 * FF, H, True),
              "down": (H, FF, False), "lm_head": (128256, H, False)}
    for name, (n, k, silu) in shapes.items():
        ws = [torch.randn(n, k, dtype=BF16, device=DEV) for _ in range(copies(n * k * 2))]
        for m in (1, 8, 32, 256, 1024) + ((16384,) if name != "lm_head" else ()):
            x = torch.randn(m, k, dtype=BF16, device=DEV)
            err = rel_err(torch.nn.functional.linear(x, ws[0]), x.float() @ ws[0].float().T)
            tt = gpu_time(lambda: [torch.nn.functional.linear(x, w) for w in ws])
            row(f"dense_{name}", f"M={m} N={n} K={k}", tt / len(ws), n * k * 2 + m * (n + k) * 2,
                2 * m * n * k, err=err)
        x = torch.randn(1, k, dtype=BF16, device=DEV)
        ref = dense_gemv_ref(x.float(), ws[0].float(), silu_and_mul=silu)
        err = rel_err(dense_gemv(x, ws[0], silu_and_mul=silu), ref)
        configs = [dense_gemv_config(n, k, silu)]
        if sweep:
            configs += [GemvConfig(bn, bk, w, st) for bn in (4, 8, 16) for bk in (256, 512, 1024)
                        for w in (2, 4, 8) for st in (1, 2, 3, 4)
                        if bn * bk <= 16384 and GemvConfig(bn, bk, w, st) != configs[0]]
        for cfg in configs:
            tt = gpu_time(lambda cfg=cfg: [dense_gemv(x, w, silu_and_mul=silu, config=cfg)
                                           for w in ws])
            row(f"triton_gemv_{name}", f"M=1 N={n} K={k}" + (" silu" if silu else ""),
                tt / len(ws), n * k * 2 + x.numel() * 2 + (n // 2 if silu else n) * 2, 2 * n * k,
                err=err if cfg is configs[0] else None,
                note=f"(BN, BK, warps, stages) {cfg}")
        ws.clear()  # free this shape's copies before the next (the lambdas hold the list)


def bench_qkv_rope(sweep: bool) -> None:
    """Batch-1 qkv GEMV with RoPE + KV-cache write in its epilogue (kernels/gemv_rope_cache.py)
    vs the pair it replaces (dense_gemv, rotary_embedding_and_cache); --sweep: other configs."""
    n, shape = (NQ + 2 * NKV) * HD, f"M=1 N={(NQ + 2 * NKV) * HD} K={H} hd={HD}"
    ws = [torch.randn(n, H, dtype=BF16, device=DEV) * H**-0.5 for _ in range(copies(n * H * 2))]
    x, pos, slot = (torch.randn(1, H, dtype=BF16, device=DEV), torch.tensor([1000], device=DEV),
                    torch.tensor([77], device=DEV))
    args = (pos, torch.randn(8192, HD, device=DEV),  # the cos/sin table, then the cache
            torch.zeros(2, 64, BS, NKV, HD, dtype=BF16, device=DEV), slot, NQ, NKV, HD)
    err = rel_err(qkv_gemv_rope_cache(x, ws[0], None, *args),
                  qkv_gemv_rope_cache_ref(x, ws[0], None, *args))
    pair = [lambda w=w: rotary_embedding_and_cache(pos, *dense_gemv(x, w).split(
        [NQ * HD, NKV * HD, NKV * HD], dim=-1), args[1], HD, args[2], slot) for w in ws]
    row("gemv_then_rotary_cache", shape, gpu_time(lambda: [f() for f in pair]) / len(ws),
        n * H * 2, 2 * n * H, note="the unfused pair (2 launches)")
    configs = [None] + ([GemvConfig(bn, bk, w, st) for bn in (4, 8, 16)
                         for bk in (256, 512, 1024) for w in (2, 4, 8) for st in (1, 2, 3)
                         if bn * bk <= 8192] * sweep)
    for cfg in configs:
        tt = gpu_time(lambda: [qkv_gemv_rope_cache(x, w, None, *args, config=cfg) for w in ws])
        row("qkv_gemv_rope_cache", shape, tt / len(ws), n * H * 2, 2 * n * H,
            err=err if cfg is None else None, note=f"(BN, BK, warps, stages) {cfg}")
    ws.clear()


def bench_moe_small() -> None:
    """The MoE's elementwise steps on Qwen3-30B-A3B's pair shapes (top-8, intermediate 768,
    hidden 2048): SiLU-and-mul over [pairs, 2 x 768] and the top-k sum over [M, 8, 2048]
    (kernels/moe_sum.py beside torch's sum over dim 1), for a prefill step (8,192 tokens)
    and a decode step of 256 sequences."""
    for m in (8192, 256):
        pairs = m * 8
        nb = 6 * pairs * 768
        gu = [torch.randn(pairs, 2 * 768, dtype=BF16, device=DEV) for _ in range(copies(nb))]
        err = rel_err(silu_and_mul(gu[0]), silu_and_mul_ref(gu[0]))
        tt = gpu_time(lambda: [silu_and_mul(x) for x in gu])
        row("silu_and_mul", f"pairs={pairs} d=768", tt / len(gu), nb, err=err)
        nb = 2 * m * 8 * 2048 + 2 * m * 2048
        xs = [torch.randn(m, 8, 2048, dtype=BF16, device=DEV) for _ in range(copies(nb))]
        err = rel_err(moe_sum(xs[0]), xs[0].sum(dim=1))
        tt = gpu_time(lambda: [moe_sum(x) for x in xs])
        row("moe_sum", f"M={m} top_k=8 H=2048", tt / len(xs), nb, err=err)
        tt = gpu_time(lambda: [x.sum(dim=1) for x in xs])
        row("torch sum(dim=1)", f"M={m} top_k=8 H=2048", tt / len(xs), nb, note="baseline")


def _attn_case(seq, q_lens):
    """seq: context lengths; q_lens: new tokens each -> q, kv, qsl, lens, bt."""
    nblk = [math.ceil(s / BS) for s in seq]
    kv = torch.randn(2, sum(nblk) + 1, BS, NKV, HD, dtype=BF16, device=DEV)
    bt = torch.zeros(len(seq), max(nblk), dtype=torch.int32, device=DEV)
    perm = torch.randperm(sum(nblk), device=DEV).to(torch.int32)
    at = 0
    for i, n in enumerate(nblk):
        bt[i, :n] = perm[at : at + n]
        at += n
    q = torch.randn(sum(q_lens), NQ, HD, dtype=BF16, device=DEV)
    qsl = torch.tensor([0, *q_lens], device=DEV).cumsum(0).to(torch.int32)
    return q, kv, qsl, torch.tensor(seq, dtype=torch.int32, device=DEV), bt


def bench_decode(sweep: bool) -> None:
    for b, ctx in ((1, 1024), (1, 4096), (1, 32768), (64, 1024), (256, 1024)):
        kv_bytes = b * ctx * NKV * HD * 2 * 2
        cases = [_attn_case([ctx] * b, [1] * b) for _ in range(copies(kv_bytes))]
        q, kv, _, lens, bt = cases[0]
        err = rel_err(paged_attention_decode(q, kv, bt, lens, HD**-0.5),
                      paged_attention_decode_ref(q, kv, bt, lens, HD**-0.5))
        configs = [{}]
        if sweep:
            configs += [dict(tile_n=tn, num_warps=w, num_stages=s)
                        for tn, w, s in ((32, 4, 2), (64, 4, 3), (128, 4, 2), (128, 8, 3))]
            configs += [dict(num_splits=ns) for ns in (1, 4, 8, 16, 64) if ns * b * NKV <= 8192]
        for cfg in configs:
            tt = gpu_time(lambda cfg=cfg: [paged_attention_decode(c[0], c[1], c[4], c[3],
                                                                  HD**-0.5, **cfg)
                                           for c in cases])
            row("paged_attention_decode", f"B={b} ctx={ctx}", tt / len(cases), kv_bytes,
                err=err if not cfg else None, note=json.dumps(cfg) if cfg else "default")


def bench_prefill(sweep: bool) -> None:
    for name, seq, ql in (("1x8192 new", [8192], [8192]), ("8x1024 new", [1024] * 8, [1024] * 8),
                          ("4x512 over 3584 cached", [4096] * 4, [512] * 4)):
        case = _attn_case(seq, ql)
        q, kv, qsl, lens, bt = case
        flops = sum(4 * NQ * HD * sum(s - n + j + 1 for j in range(n)) for s, n in zip(seq, ql))
        err = rel_err(paged_attention_prefill(q, kv, qsl, lens, bt, HD**-0.5),
                      paged_attention_prefill_ref(q, kv, qsl, lens, bt, HD**-0.5))
        configs = [{}]
        if sweep:
            configs += [dict(block_m=m, tile_n=n, num_warps=w, num_stages=s)
                        for m, n, w, s in ((64, 64, 4, 3), (128, 64, 4, 2), (128, 64, 8, 2),
                                           (128, 128, 8, 2), (64, 128, 4, 2))]
        for cfg in configs:
            tt = gpu_time(lambda cfg=cfg: paged_attention_prefill(q, kv, qsl, lens, bt,
                                                                  HD**-0.5, **cfg))
            row("paged_attention_prefill", name, tt, flops=flops, err=err if not cfg else None,
                note=json.dumps(cfg) if cfg else "default")


def bench_unified(sweep: bool) -> None:
    """The unified kernel on decode rows (what a FULL graph and a mixed step run), and a
    mixed step whole vs split (decode rows on the decode kernel, the rest unified)."""
    for b, ctx in ((1, 1024), (64, 1024), (256, 1024)):
        kv_bytes = b * ctx * NKV * HD * 2 * 2
        cases = [_attn_case([ctx] * b, [1] * b) for _ in range(copies(kv_bytes))]
        q, kv, qsl, lens, bt = cases[0]
        err = rel_err(paged_attention_prefill(q, kv, qsl, lens, bt, HD**-0.5),
                      paged_attention_decode_ref(q, kv, bt, lens, HD**-0.5))
        configs = [{}] + ([dict(block_m=m, tile_n=n, num_warps=w)
                           for m in (16, 64) for n in (16, 32, 64) for w in (2, 4)]
                          if sweep else [])
        for cfg in configs:
            tt = gpu_time(lambda cfg=cfg: [paged_attention_prefill(
                c[0], c[1], c[2], c[3], c[4], HD**-0.5, **cfg) for c in cases])
            row("unified on decode rows", f"B={b} ctx={ctx}", tt / len(cases), kv_bytes,
                err=err if not cfg else None, note=json.dumps(cfg) if cfg else "default")
    d, seq = 256, [1024] * 256 + [1024] * 8  # 256 decode rows + 8 new 1024-token prompts
    q, kv, qsl, lens, bt = _attn_case(seq, [1] * d + [1024] * 8)
    pre_q, pre_qsl = q[d:], (qsl[d:] - d).contiguous()
    flops = 8 * 4 * NQ * HD * sum(range(1, 1025)) + d * 4 * NQ * HD * 1024
    configs = [{}] + ([dict(block_m=m) for m in (16, 32, 128)] if sweep else [])
    for cfg in configs:
        tt = gpu_time(lambda cfg=cfg: paged_attention_prefill(q, kv, qsl, lens, bt, HD**-0.5,
                                                              **cfg))
        row("mixed 256 decode + 8x1024", "whole (unified)", tt, flops=flops,
            note=json.dumps(cfg) if cfg else "default")
    tt = gpu_time(lambda: (paged_attention_decode(q[:d], kv, bt[:d], lens[:d], HD**-0.5),
                           paged_attention_prefill(pre_q, kv, pre_qsl, lens[d:], bt[d:],
                                                   HD**-0.5)))
    row("mixed 256 decode + 8x1024", "split (decode + unified)", tt, flops=flops,
        note="default")


def random_weight(qtype: int, n: int, k: int) -> torch.Tensor:
    block, size = GGML_TYPE_TRAITS[GGMLType(qtype)]
    w = torch.randint(0, 256, (n * k // block, size), dtype=torch.uint8, device=DEV)
    for at in {GGMLType.Q6_K: (208,), GGMLType.Q8_0: (0,), GGMLType.Q4_0: (0,)}.get(qtype,
                                                                                      (0, 2)):
        s = (torch.randn(w.shape[0], device=DEV) * 0.01).half()
        w[:, at : at + 2] = s.view(torch.uint8).view(-1, 2)
    return w.view(n, -1)


def gguf_gemm_ref(x: torch.Tensor, w: torch.Tensor, qtype: int) -> torch.Tensor:
    return (x.float() @ gguf_dequantize_ref(w, qtype, torch.float32).T).to(x.dtype)


LLAMA_LINEARS = {"qkv": (6144, H), "o": (H, H), "gate_up": (2 * FF, H), "down": (H, FF)}
# (BLOCK_N, blocks per step, warps) tried per type by --sweep, besides gguf_gemv_config's
GEMV_SWEEP = {
    GGMLType.Q4_K: [(1, 2, 1), (2, 2, 1), (8, 2, 1), (4, 4, 1), (4, 4, 2), (2, 4, 1)],
    GGMLType.Q6_K: [(1, 4, 1), (2, 4, 1), (8, 4, 1), (4, 8, 1), (4, 8, 2), (2, 8, 1)],
    GGMLType.Q8_0: [(1, 8, 1), (2, 8, 1), (8, 8, 1), (4, 16, 1), (4, 16, 2), (2, 16, 1)],
    GGMLType.Q4_0: [(1, 16, 1), (2, 16, 1), (8, 16, 1), (4, 32, 1), (4, 32, 2), (2, 32, 1)],
}


def bench_gguf(sweep: bool) -> None:
    per_token = {}
    for qtype in (GGMLType.Q4_0, GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q6_K):
        per_token[qtype.name] = 0.0
        for lin, (n, k) in LLAMA_LINEARS.items():
            w0 = random_weight(qtype, n, k)
            ws = [w0] + [random_weight(qtype, n, k) for _ in range(copies(w0.numel()) - 1)]
            x = torch.randn(1, k, dtype=BF16, device=DEV)
            err = rel_err(gg.gguf_gemv(x, w0, qtype), gguf_gemm_ref(x.float(), w0, qtype))
            nbytes = w0.numel() + 2 * (k + n)
            configs = [None]
            if sweep:
                configs += [c for c in map(lambda t: GgufBlocksConfig(*t), GEMV_SWEEP[qtype])
                            if c != gg.gguf_gemv_config(qtype, n)]
            best = None
            for cfg in configs:
                tt = gpu_time(lambda cfg=cfg: [gg.gguf_gemv(x, w, qtype, config=cfg) for w in ws])
                tt /= len(ws)
                best = tt if best is None else min(best, tt)
                row(f"gguf_gemv {qtype.name}", f"{lin} {n}x{k} M=1", tt, nbytes,
                    err=err if cfg is None else None,
                    note=str(cfg) if cfg else f"default {gg.gguf_gemv_config(qtype, n)}")
            per_token[qtype.name] += 32 * (best or 0)
    for lin, (n, k) in LLAMA_LINEARS.items():
        dense = [torch.randn(n, k, dtype=BF16, device=DEV) for _ in range(copies(2 * n * k))]
        x = torch.randn(1, k, dtype=BF16, device=DEV)
        tt = gpu_time(lambda: [x @ d.T for d in dense]) / len(dense)
        row("torch bf16 GEMV", f"{lin} {n}x{k} M=1", tt, 2 * n * k, note="cuBLAS baseline")
    for name, t in per_token.items():
        print(f"  Llama-3.1-8B {name} linear layers (32 x qkv+o+gate_up+down, best config): "
              f"{t * 1e3:.3f} ms per token")
    ROWS.append({"kernel": "llama8b_linears_per_token_ms", "values": {k: v * 1e3 for k, v in
                                                                      per_token.items()}})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", nargs="*", help="sections whose launch configs to sweep "
                    "(no names: all)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--only", nargs="*",
                    default=["small", "moe", "dense", "qkv_rope", "decode", "prefill", "unified",
                             "gguf"])
    args = ap.parse_args()
    torch.manual_seed(0)
    start = time.time()
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  "
          f"triton {__import__('triton').__version__}", flush=True)
    sweep = {n for n in ("dense", "qkv_rope", "decode", "prefill", "unified", "gguf")
             if args.sweep is not None and (not args.sweep or n in args.sweep)}
    steps = {"small": lambda: bench_small(), "moe": lambda: bench_moe_small(),
             "dense": lambda: bench_dense("dense" in sweep),
             "qkv_rope": lambda: bench_qkv_rope("qkv_rope" in sweep),
             "decode": lambda: bench_decode("decode" in sweep),
             "prefill": lambda: bench_prefill("prefill" in sweep),
             "unified": lambda: bench_unified("unified" in sweep),
             "gguf": lambda: bench_gguf("gguf" in sweep)}
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": __import__("triton").__version__, "date": time.strftime("%Y-%m-%d"),
            "command": " ".join(sys.argv)}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    for name in args.only:
        print(f"[{name}] {time.time() - start:.0f}s", flush=True)
        try:
            steps[name]()
        except Exception:  # report and go on: one broken kernel must not hide the others
            traceback.print_exc()
            ROWS.append({"kernel": name, "error": traceback.format_exc(limit=3)})
        meta["seconds"] = time.time() - start
        (Path(args.out) / "kernels.json").write_text(json.dumps({"meta": meta, "rows": ROWS},
                                                                indent=1))
    summary()


def summary() -> None:
    """One line per (kernel, shape): the default config and, if swept, the fastest one."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in ROWS:
        if "us" in r:
            groups.setdefault((r["kernel"], r["shape"]), []).append(r)
    print(f"\n{'kernel':<24}{'shape':<30}{'us':>9}{'%BW':>6}{'%pk':>6}{'err':>9}  "
          f"best (us, config) when swept")
    for (kernel, shape), rs in groups.items():
        d = rs[0]
        best = min(rs, key=lambda r: r["us"])
        err = d["max_rel_err"]
        alt = f"{best['us']:.2f} {best['note']}" if best is not d else ""
        print(f"{kernel:<24}{shape:<30}{d['us']:9.2f}{d['pct_bw']:6.1f}{d['pct_peak']:6.1f}"
              f"{err if err is not None else float('nan'):9.1e}  {d['note']} {alt}")


if __name__ == "__main__":
    main()
