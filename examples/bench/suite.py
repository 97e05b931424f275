"""The fixed GPU benchmark suite: one command, a table printed last, JSON under $OUT.

    PYTHONPATH=. python -m examples.bench.suite [--throughput-prompts 1000]
        [--budget-s 540] [--cudagraph-mode MODE]
        [--steps llama8b-graphs llama8b-seqs64 llama8b-eager qwen3-8b qwen3-30b-a3b]
    PYTHONPATH=. python -m examples.bench.suite --budget-s 560 \
        --steps qwen3.5-35b-a3b qwen3.5-27b     # the hybrid GDN steps, opt-in
    PYTHONPATH=. python -m examples.bench.suite --steps llama8b-fp8 qwen3.5-35b-a3b-fp8

Every step is a child process (`--step NAME`) that builds one engine with random weights
of a real architecture (examples/bench/models/, --load-format dummy, bf16, token-id
prompts) and runs benchmarks on it through examples/bench/{startup,latency,throughput}.py:

- llama8b-graphs: start-up to the first token (imports, dummy init, KV cache, CUDA-graph
  capture, one request); `latency` batch 1/8/32 (32 in, 128 out); `throughput` random
  N x (1024 in, 128 out), temperature 1.0, ignore_eos; `throughput` on 200
  sharegpt-synthetic prompts (the size of vLLM CI's H200 ShareGPT run).
- llama8b-seqs64: `throughput` random 300 x (1024 in, 128 out) at --max-num-seqs 64
  (most steps mix prefill chunks with decodes: the graphed-mixed-steps figure).
- llama8b-eager: `latency` batch 1 with --enforce-eager.
- qwen3-8b: `latency` batch 1 with CUDA graphs; qwen3-30b-a3b: `latency` batch 1/8/32 and
  `throughput` random N x (1024 in, 128 out) (target: >= 1.3x Llama-8B's).
- qwen3.5-35b-a3b, qwen3.5-27b (hybrid Gated DeltaNet; not in the default
  --steps: with 70 / 54 GB of weights they need a device call of their own): `latency`
  batch 1 and `throughput` random N x (1024 in, 128 out), CUDA graphs.
- llama8b-fp8, qwen3.5-35b-a3b-fp8 (opt-in): the same two benchmarks on block-FP8 weights
  (`quantization_config` of Qwen's FP8 releases in the model folder: fp8 weights with
  128 x 128 block scales, dynamic per-token-group activations; engine/layers/quantization/).

Batch-1 decode is latency's decode throughput excluding the first step. Prefix caching is
off in every step (latency's default; the random prompts share no prefix). A child writes
$OUT/suite-<step>.json after each benchmark and its output to $OUT/suite.log, so one that
runs out of time keeps what it measured; the parent gives each step what is left of
--budget-s and marks what did not run as PENDING. Batch-1 rooflines use the copy bandwidth
the steps measure on their GPU (one suite run, one GPU: the first step's figure); the
throughput bound and vLLM's figures are the H200's
(docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODELS = Path(__file__).resolve().parent / "models"
COMMON = ["--load-format", "dummy", "--skip-tokenizer-init", "--dtype", "bfloat16",
          "--max-model-len", "2048"]
LAT = ["--input-len", "32", "--output-len", "128", "--num-iters-warmup", "1",
       "--num-iters", "3"]
STEPS = {  # name: (model directory, extra engine flags, latency batch sizes)
    "llama8b-graphs": ("llama-3.1-8b", [], [1, 8, 32]),
    "llama8b-seqs64": ("llama-3.1-8b", ["--max-num-seqs", "64"], []),
    "llama8b-eager": ("llama-3.1-8b", ["--enforce-eager"], [1]),
    "qwen3-8b": ("qwen3-8b", [], [1]),
    "qwen3-30b-a3b": ("qwen3-30b-a3b", [], [1, 8, 32]),
    # hybrid GDN. Memory on the H200 (139 GiB; --gpu-memory-utilization 0.9 of it
    # is 125 GiB): 27B has 50.1 GiB of weights plus 36.8 GiB of state for the default 256
    # slots and the null slot (48 GDN layers x 3.2 MB = 153.9 MB a request, fp32 SSM state),
    # which leaves ~33 GiB of KV at 64 KiB/token (16 attention layers), where 256 x 1152
    # tokens need 18 GiB. 35B-A3B has 64.6 GiB + 15.4 GiB of state (30 x 2.1 MB = 64.4 MB a
    # request), leaving ~40 GiB at 20 KiB/token. On the H200 (2026-12-01) 35B-A3B ran at
    # the default 256 sequences, 27B did not ("No available memory for the cache blocks":
    # the profile run's activations take the rest), so 27B runs 128 state slots (19.7 GiB).
    "qwen3.5-35b-a3b": ("qwen3.5-35b-a3b", [], [1]),
    "qwen3.5-27b": ("qwen3.5-27b", ["--max-num-seqs", "128"], [1]),
    # block FP8 (opt-in): 8.0 GB / 35.8 GB of weights
    "llama8b-fp8": ("llama-3.1-8b-fp8", [], [1]),
    "qwen3.5-35b-a3b-fp8": ("qwen3.5-35b-a3b-fp8", [], [1]),
}
DEFAULT_STEPS = ["llama8b-graphs", "llama8b-seqs64", "llama8b-eager", "qwen3-8b",
                 "qwen3-30b-a3b"]
RANDOM_THROUGHPUT_STEPS = {"llama8b-graphs", "qwen3-30b-a3b", "qwen3.5-35b-a3b", "qwen3.5-27b",
                           "llama8b-fp8", "qwen3.5-35b-a3b-fp8"}
# batch-1 decode: bytes read per step (weights less the embedding table); the roofline is
# the device-to-device copy bandwidth the steps measure on their GPU (copy_tbps in each
# step's JSON; the table takes the first) over these bytes, BW (the H200's 4.28 TB/s)
# where no step measured one
BW = 4.28e12
STEP_BYTES = {"llama-3.1-8b": 15.01e9, "qwen3-8b": 2 * (8.191e9 - 151936 * 4096),
              "qwen3-30b-a3b": 2 * 3.04e9,
              # Qwen3.5-27B: all 26.896e9 parameters (meta-device count) less the embedding
              # table 248320 x 5120: 25.625e9 x 2 B = 51.25 GB. The GDN state (48 x 3.2 MB,
              # read and written) adds 0.3 GB, 0.6%, not counted.
              "qwen3.5-27b": 2 * (26_895_998_464 - 248320 * 5120),
              # Qwen3.5-35B-A3B, active weights per token: all 34.661e9 parameters less the
              # embedding table (248320 x 2048) less the 248 routed experts of 256 not picked
              # (40 layers x 248 x 3 x 2048 x 512): GDN 1.012e9 + attention 0.273e9 + routers
              # 0.021e9 + shared experts 0.126e9 + top-8 experts 1.007e9 + lm_head 0.509e9
              # = 2.946e9 x 2 B = 5.89 GB. State (30 x 2.1 MB) not counted.
              "qwen3.5-35b-a3b": 2 * (34_660_610_688 - 248320 * 2048
                                      - 40 * 248 * 3 * 2048 * 512),
              # FP8: the quantized linear weights at 1 B, the LM head (and routers) at 2 B.
              # Llama: 8.030e9 less embedding and LM head (2 x 128256 x 4096) at 1 B plus
              # the LM head at 2 B = 8.03 GB. Qwen3.5-35B-A3B: of the 2.946e9 active above,
              # GDN + attention + shared + top-8 experts (2.418e9) at 1 B, routers + LM head
              # (0.530e9) at 2 B = 3.48 GB
              "llama-3.1-8b-fp8": 8_030_261_248 - 128256 * 4096,
              "qwen3.5-35b-a3b-fp8": 2.418e9 + 2 * 0.530e9}
# per-step flags on a GPU under 100 GiB (an 80 GB H100): the bf16 hybrid's 64.6 GiB of
# weights leave the 16,384-token profile no KV memory at vLLM's defaults; 32 seats fit
SMALL_GPU_FLAGS = {"qwen3.5-35b-a3b": ["--max-num-seqs", "32"]}
THROUGHPUT_BOUND = 47.7  # req/s, 1000 x (1024, 128) at 799 TFLOP/s (performance anchors)
VLLM_H200 = 22.6  # req/s, vLLM CI throughput_llama8B_tp1 (ShareGPT, 200 prompts, H200)
THROUGHPUT_LENS = (1024, 128)  # (input, output) tokens of the random throughput run
SHAREGPT_PROMPTS = 200  # as vLLM CI's throughput_llama8B_tp1
SEQS64_PROMPTS = 300  # llama8b-seqs64: 300 x THROUGHPUT_LENS at --max-num-seqs 64
# target ratios; the hybrids' as fractions of their batch-1 roofline
TARGETS = {"b1": 250.0, "eager_b1": 60.0, "throughput": 34.0, "seqs64": 26.0, "startup": 20.0,
           "qwen3.5-35b-a3b": 0.5, "qwen3.5-27b": 0.8,
           "moe_vs_llama": 1.3}  # 30B-A3B offline >= 1.3x Llama-8B's, same run
# vLLM's published Qwen3-30B-A3B figure (performance anchors A9): not like-for-like
VLLM_QWEN3_30B = "vLLM bf16, 1xH100, concurrency 10, 2048 in / 1024 out: TPOT 13.18 ms (A9)"
# vLLM's published figures for the hybrid GDN models (the performance anchors P1/P5/P6/P9):
# (conditions and figure, batch-1 decode tok/s to compare with or None).
# None is on one H200 in bf16. P1 runs TP=8 on 8 H200 (batch-1 decode there splits the
# weights over 8 GPUs), P5 is FP8, P6 FP8 on an H100: printed with no ratio. P9 (Qwen3.6-27B,
# the same shapes) is bf16, one GPU, single stream, on an MI300X (5.3 TB/s against the
# H200's 4.8): the table prints that ratio, labelled as across GPUs.
VLLM_PUBLISHED = {
    "qwen3.5-35b-a3b": [
        ("vLLM 0.19 bf16, 8xH200 TP=8, random 1024/1024: c1 984, c64 12,810 tok/s in+out (P1)",
         None),
        ("vLLM FP8, 1xH200 (GPUStack): ShareGPT 9,632 total tok/s, TPOT 24.7 ms (P5)", None)],
    "qwen3.5-27b": [
        ("vLLM 0.31 bf16 (Qwen3.6-27B), 1xMI300X: 1 stream 67 tok/s (~200 in, 512 out) (P9)", 67.0),
        ("vLLM 0.21 FP8 (Qwen3.6-27B), 1xH100: decode 77 tok/s, 512-token prompt (P6)", None)],
}


def run_step(name: str, out_dir: Path, throughput_prompts: int,
             cudagraph_mode: str | None = None) -> None:
    """Child: one engine, its benchmarks, JSON rewritten after each."""
    from examples.bench import latency, startup, throughput

    model, extra, batches = STEPS[name]
    bandwidth, memory = _device_bandwidth()
    if 0 < memory < 100 * 2 ** 30:
        extra = [*extra, *SMALL_GPU_FLAGS.get(name, [])]
    engine_flags = ["--model", str(MODELS / model), *COMMON, *extra]
    if cudagraph_mode:
        engine_flags += ["--cudagraph-mode", cudagraph_mode]
    path = out_dir / f"suite-{name}.json"
    results: dict = {"step": name, "model": model, "engine_flags": engine_flags}

    def save() -> None:
        path.write_text(json.dumps(results, indent=2))

    def parse(module, argv: list[str]) -> argparse.Namespace:
        parser = argparse.ArgumentParser()
        module.add_cli_args(parser)
        return parser.parse_args([*argv, *engine_flags])

    engine, results["startup"] = startup.timed_start(parse(startup, []))
    results["memory_profile"] = dict(engine.memory_profile)
    results["device"] = _device_name()
    results["copy_tbps"] = bandwidth / 1e12 if bandwidth else None
    save()
    for b in batches:
        print(f"[{name}] latency batch {b}", flush=True)
        r = latency.run(engine, parse(latency, [*LAT, "--batch-size", str(b)]))
        results[f"latency_b{b}"] = {k: v for k, v in r.items() if k != "latencies"}
        save()
    prompts = SEQS64_PROMPTS if name == "llama8b-seqs64" else \
        throughput_prompts if name in RANDOM_THROUGHPUT_STEPS else 0
    if prompts > 0:
        print(f"[{name}] throughput {prompts} x {THROUGHPUT_LENS}", flush=True)
        results["throughput"] = throughput.run(engine, parse(throughput, [
            "--dataset-name", "random", "--input-len", str(THROUGHPUT_LENS[0]),
            "--output-len", str(THROUGHPUT_LENS[1]),
            "--num-prompts", str(prompts), "--temperature", "1.0"]))
        save()
    if name == "llama8b-graphs" and throughput_prompts > 0:
        print(f"[{name}] throughput sharegpt-synthetic {SHAREGPT_PROMPTS}", flush=True)
        results["throughput_sharegpt"] = throughput.run(engine, parse(throughput, [
            "--dataset-name", "sharegpt-synthetic", "--num-prompts", str(SHAREGPT_PROMPTS)]))
        save()


def _device_bandwidth() -> tuple[float | None, int]:
    """(examples/bench/kernels.py's copy bandwidth in bytes/s, None without CUDA; the GPU's
    total memory in bytes, 0 without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return None, 0
    from examples.bench.kernels import copy_bandwidth

    bandwidth = copy_bandwidth()
    torch.cuda.empty_cache()
    return bandwidth, torch.cuda.get_device_properties(0).total_memory


def _device_name() -> str:
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    return f"{torch.cuda.get_device_name()} (torch {torch.__version__})"


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "PENDING" if value is None else format(value, spec)


def _ratio(value: float, ref: float) -> str:
    return f"{100 * value / ref:.0f}%"


def table(results: dict[str, dict], status: dict[str, str]) -> str:
    def get(step: str, *keys: str):
        node = results.get(step)
        for k in keys:
            node = node.get(k) if isinstance(node, dict) else None
        return node

    bw = next((r["copy_tbps"] * 1e12 for r in results.values() if r.get("copy_tbps")), BW)
    roofline = {m: bw / b for m, b in STEP_BYTES.items()}  # batch-1 tok/s
    rows = [("workload", "result", "ratio", "target / note"),
            ("device-to-device copy (rooflines below)", f"{bw / 1e12:.2f} TB/s",
             "measured" if bw != BW else "the H200's, none measured", "")]
    for step, label in (("llama8b-graphs", "Llama-8B b1 decode, CUDA graphs"),
                        ("llama8b-eager", "Llama-8B b1 decode, eager"),
                        ("qwen3-8b", "Qwen3-8B b1 decode, CUDA graphs"),
                        ("qwen3-30b-a3b", "Qwen3-30B-A3B b1 decode, CUDA graphs")):
        v = get(step, "latency_b1", "decode_tokens_per_second")
        model = STEPS[step][0]
        note = {"llama8b-graphs": f">= {TARGETS['b1']:.0f}",
                "llama8b-eager": f">= {TARGETS['eager_b1']:.0f}"}.get(step, "")
        ratio = f"{_ratio(v, roofline[model])} of {roofline[model]:.0f} roofline" \
            if v is not None else status.get(step, "not run")
        rows.append((label, f"{_fmt(v)} tok/s", ratio, note))
    rows += _latency_rows(get, "llama8b-graphs", "Llama-8B", (1, 8, 32))
    tp = get("llama8b-graphs", "throughput") or {}
    rps = tp.get("requests_per_second")
    ratio = f"{_ratio(rps, THROUGHPUT_BOUND)} of {THROUGHPUT_BOUND} bound; " \
        f"{_ratio(rps, VLLM_H200)} of vLLM {VLLM_H200}" if rps is not None else ""
    rows.append((f"Llama-8B throughput {tp.get('num_requests', '-')} x {THROUGHPUT_LENS}",
                 f"{_fmt(rps, '.2f')} req/s, {_fmt(tp.get('output_tokens_per_second'))} "
                 "out tok/s", ratio, f">= {TARGETS['throughput']:.0f}"))
    s64 = get("llama8b-seqs64", "throughput") or {}
    rps = s64.get("requests_per_second")
    rows.append((f"Llama-8B throughput {s64.get('num_requests', '-')} x {THROUGHPUT_LENS}, "
                 "--max-num-seqs 64", f"{_fmt(rps, '.2f')} req/s, "
                 f"{_fmt(s64.get('output_tokens_per_second'))} out tok/s",
                 status.get("llama8b-seqs64", ""), f">= {TARGETS['seqs64']:.0f}"))
    sg = get("llama8b-graphs", "throughput_sharegpt") or {}
    rps = sg.get("requests_per_second")
    rows.append((f"Llama-8B throughput sharegpt-synthetic {sg.get('num_requests', '-')}",
                 f"{_fmt(rps, '.2f')} req/s, {_fmt(sg.get('output_tokens_per_second'))} "
                 "out tok/s", "" if rps is None else f"{_ratio(rps, VLLM_H200)} of vLLM "
                 f"{VLLM_H200} (real ShareGPT)", ""))
    rows.append(("Llama-8B peak GPU memory (throughput)",
                 f"{_fmt(tp.get('peak_gpu_memory_gib'))} GiB", "", ""))
    st = get("llama8b-graphs", "startup") or {}
    rows.append(("Llama-8B start-up to first token (graphs)",
                 f"{_fmt(st.get('total_startup_time'))} s",
                 f"import {_fmt(st.get('import_time'))}, init {_fmt(st.get('engine_init_time'))}"
                 f", 1st tok {_fmt(st.get('first_token_time'), '.2f')}, graph capture "
                 f"{_fmt(st.get('cudagraph_capture_time'), '.2f')}",
                 f"<= {TARGETS['startup']:.0f} s"))
    mp = get("llama8b-graphs", "memory_profile") or {}
    if mp:
        rows.append(("Llama-8B CUDA-graph memory", f"{mp.get('cudagraph_pool', 0) / 2**30:.2f} "
                     "GiB pool", f"profile counted {mp.get('cudagraph_estimate', 0) / 2**30:.2f}"
                     " GiB", ""))
    rows += _moe_rows(get, status)
    rows += _gdn_rows(get, results, status, roofline)
    rows += _fp8_rows(get, results, status, roofline)
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join(" | ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows)


def _latency_rows(get, step: str, label: str, batches) -> list[tuple[str, str, str, str]]:
    """One row per latency batch size of a step: average latency and decode throughput."""
    rows = []
    for b in batches:
        lat = get(step, f"latency_b{b}", "avg_latency")
        dec = get(step, f"latency_b{b}", "decode_tokens_per_second")
        rows.append((f"{label} latency bs {b} (32 in, 128 out)", f"{_fmt(lat, '.3f')} s",
                     f"decode {_fmt(dec)} tok/s", ""))
    return rows


def _moe_rows(get, status: dict) -> list[tuple[str, str, str, str]]:
    """The MoE rows beyond batch 1: Qwen3-30B-A3B latency at batch 8 / 32 and offline
    throughput against Llama-8B's of the same run."""
    rows = _latency_rows(get, "qwen3-30b-a3b", "Qwen3-30B-A3B", (8, 32))
    tp = get("qwen3-30b-a3b", "throughput") or {}
    rps = tp.get("requests_per_second")
    llama = get("llama8b-graphs", "throughput", "requests_per_second")
    ratio = f"{rps / llama:.2f}x Llama-8B's" if rps is not None and llama else \
        status.get("qwen3-30b-a3b", "")
    rows.append((f"Qwen3-30B-A3B throughput {tp.get('num_requests', '-')} x {THROUGHPUT_LENS}",
                 f"{_fmt(rps, '.2f')} req/s, {_fmt(tp.get('output_tokens_per_second'))} "
                 "out tok/s", ratio, f">= {TARGETS['moe_vs_llama']}x Llama-8B"))
    rows.append(("  vLLM published (Qwen3-30B-A3B)", "", "no ratio: not like-for-like",
                 VLLM_QWEN3_30B))
    return rows


def _gdn_rows(get, results: dict, status: dict, roofline: dict[str, float]
              ) -> list[tuple[str, str, str, str]]:
    """The hybrid rows, for the hybrid GDN steps that ran or were asked for."""
    rows = []
    for step, label in (("qwen3.5-35b-a3b", "Qwen3.5-35B-A3B"), ("qwen3.5-27b", "Qwen3.5-27B")):
        if step not in results and step not in status:
            continue
        roof = roofline[STEPS[step][0]]
        v = get(step, "latency_b1", "decode_tokens_per_second")
        ratio = f"{_ratio(v, roof)} of {roof:.0f} roofline" if v is not None \
            else status.get(step, "not run")
        rows.append((f"{label} b1 decode, CUDA graphs", f"{_fmt(v)} tok/s", ratio,
                     f">= {100 * TARGETS[step]:.0f}% of roofline"))
        tp = get(step, "throughput") or {}
        rows.append((f"{label} throughput {tp.get('num_requests', '-')} x {THROUGHPUT_LENS}",
                     f"{_fmt(tp.get('requests_per_second'), '.2f')} req/s, "
                     f"{_fmt(tp.get('output_tokens_per_second'))} out tok/s",
                     f"peak {_fmt(tp.get('peak_gpu_memory_gib'))} GiB", ""))
        for ref, value in VLLM_PUBLISHED[step]:
            ratio = "no ratio: not like-for-like" if value is None else \
                "b1 " + (_ratio(v, value) if v is not None else "PENDING") + " of it (MI300X)"
            rows.append((f"  vLLM published ({label})", "", ratio, ref))
    return rows


def _fp8_rows(get, results: dict, status: dict, roofline: dict[str, float]
              ) -> list[tuple[str, str, str, str]]:
    """The block-FP8 steps' rows, when they ran or were asked for."""
    rows = []
    for step, label in (("llama8b-fp8", "Llama-8B FP8"),
                        ("qwen3.5-35b-a3b-fp8", "Qwen3.5-35B-A3B FP8")):
        if step not in results and step not in status:
            continue
        roof = roofline[STEPS[step][0]]
        v = get(step, "latency_b1", "decode_tokens_per_second")
        ratio = f"{_ratio(v, roof)} of {roof:.0f} roofline" if v is not None \
            else status.get(step, "not run")
        rows.append((f"{label} b1 decode, CUDA graphs", f"{_fmt(v)} tok/s", ratio, ""))
        tp = get(step, "throughput") or {}
        rows.append((f"{label} throughput {tp.get('num_requests', '-')} x {THROUGHPUT_LENS}",
                     f"{_fmt(tp.get('requests_per_second'), '.2f')} req/s, "
                     f"{_fmt(tp.get('output_tokens_per_second'))} out tok/s",
                     f"peak {_fmt(tp.get('peak_gpu_memory_gib'))} GiB", ""))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", nargs="+", choices=list(STEPS), default=DEFAULT_STEPS)
    ap.add_argument("--throughput-prompts", type=int, default=1000)
    ap.add_argument("--budget-s", type=float, default=540.0)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--cudagraph-mode", default=None, help="passed to every step's engine")
    ap.add_argument("--step", choices=list(STEPS), help=argparse.SUPPRESS)  # child mode
    args = ap.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.step:
        run_step(args.step, out_dir, args.throughput_prompts, args.cudagraph_mode)
        return
    deadline = time.monotonic() + args.budget_s
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    results, status = {}, {}
    for step in args.steps:
        left = deadline - time.monotonic()
        if left < 30:
            status[step] = "PENDING: suite time budget spent"
            continue
        log = out_dir / "suite.log"  # one log for all steps: the device returns few files
        t0 = time.monotonic()
        with log.open("a") as f:
            f.write(f"===== {step}\n")
            f.flush()
            start = f.tell()
            try:
                rc = subprocess.run([sys.executable, "-m", "examples.bench.suite", "--step", step,
                                     "--out", str(out_dir), "--throughput-prompts",
                                     str(args.throughput_prompts),
                                     *(["--cudagraph-mode", args.cudagraph_mode]
                                       if args.cudagraph_mode else [])], cwd=ROOT, env=env,
                                    stdout=f, stderr=subprocess.STDOUT, timeout=left).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        status[step] = "" if rc == 0 else f"step ended: {rc}"
        print(f"== {step}: rc={rc} in {time.monotonic() - t0:.0f} s", flush=True)
        if rc != 0:
            with log.open(errors="replace") as f:
                f.seek(start)
                print("\n".join(f.read().splitlines()[-25:]), flush=True)
        path = out_dir / f"suite-{step}.json"
        if path.exists():
            results[step] = json.loads(path.read_text())
    (out_dir / "suite.json").write_text(json.dumps({"results": results, "status": status},
                                                   indent=2))
    device = next((r.get("device") for r in results.values() if r.get("device")), "?")
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"\nlibvllm bench suite on {device}, {when}")
    print(table(results, status))


if __name__ == "__main__":
    main()
