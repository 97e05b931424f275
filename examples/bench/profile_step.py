"""Where a decode step's time goes on CUDA: wall time, GPU kernel time, idle gaps, top kernels.

    PYTHONPATH=. python -m examples.bench.profile_step --model examples/bench/models/llama-3.1-8b \
        --load-format dummy --skip-tokenizer-init --dtype bfloat16 --batch-size 1

The engine flags are latency's (examples/bench/engine_args.py). --batch-size random prompts
of --input-len token ids generate --output-len tokens once for warm-up, then once more with
the first step (the prefill) outside torch.profiler and every decode step inside it. Prints
per decode step: the wall time, the sum of GPU kernel times (one stream, so its busy time),
the idle time between kernels split into gaps shorter and longer than 20 us (launch gaps vs
host work the GPU waits for), and the kernels by device time. The purpose of vLLM's
`vllm bench latency --profile` (a torch profiler trace), summarised as a table; writes
profile_step-b<batch>.json to --out (default $OUT or .).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from examples.bench import engine_args

_LONG_GAP_US = 20.0


def kernel_spans(prof) -> list[tuple[str, float, float]]:
    """(name, start us, end us) of every CUDA kernel and memcpy the profiler saw, by start."""
    from torch.autograd import DeviceType

    spans = [(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
             if e.device_type == DeviceType.CUDA]
    return sorted(spans, key=lambda s: s[1])


def summarize(spans: list[tuple[str, float, float]], steps: int, wall_s: float) -> dict:
    busy = sum(end - start for _, start, end in spans)
    gaps = [b[1] - a[2] for a, b in zip(spans, spans[1:]) if b[1] > a[2]]
    long_gaps = [g for g in gaps if g >= _LONG_GAP_US]
    per_kernel: dict[str, list[float]] = {}
    for name, start, end in spans:
        per_kernel.setdefault(name, []).append(end - start)
    top = sorted(per_kernel.items(), key=lambda kv: -sum(kv[1]))
    return {
        "decode_steps": steps, "wall_us_per_step": 1e6 * wall_s / steps,
        "gpu_busy_us_per_step": busy / steps,
        "short_gaps_us_per_step": (sum(gaps) - sum(long_gaps)) / steps,
        "long_gaps_us_per_step": sum(long_gaps) / steps,
        "kernels_per_step": len(spans) / steps,
        "kernels": [{"name": name, "calls_per_step": len(ts) / steps,
                     "us_per_step": sum(ts) / steps, "us_per_call": sum(ts) / len(ts)}
                    for name, ts in top],
    }


def run(engine, args: argparse.Namespace) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    engine_args.check_max_model_len(engine, args.input_len + args.output_len)
    params = engine_args.sampling_params(args.output_len, args.temperature)
    prompts = np.random.randint(10000, size=(args.batch_size, args.input_len)).tolist()
    engine_args.generate(engine, prompts, [params] * len(prompts), "warm-")
    for i, prompt in enumerate(prompts):
        engine.add_request(f"prof-{i}", prompt, params)
    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    while not engine_args.first_tokens_sampled(engine):  # the prefill, outside the profile
        engine.step()
    sync()
    steps = 0
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        while engine.has_unfinished_requests():
            engine.step()
            steps += 1
        sync()
        wall = time.perf_counter() - start
    res = summarize(kernel_spans(prof), steps, wall)
    print(f"decode steps {steps}, batch {args.batch_size}: wall {res['wall_us_per_step']:.1f} "
          f"us/step, GPU busy {res['gpu_busy_us_per_step']:.1f}, idle gaps < 20 us "
          f"{res['short_gaps_us_per_step']:.1f}, >= 20 us {res['long_gaps_us_per_step']:.1f}, "
          f"{res['kernels_per_step']:.0f} kernels/step (timed under the profiler)")
    print(f"{'us/step':>9} {'calls':>6} {'us/call':>8}  kernel")
    for k in res["kernels"][:args.top]:
        print(f"{k['us_per_step']:9.1f} {k['calls_per_step']:6.1f} {k['us_per_call']:8.2f}  "
              f"{k['name'][:110]}")
    return res


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m examples.bench.profile_step")
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top", type=int, default=25, help="kernels to print")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    engine_args.add_engine_args(parser)
    parser.set_defaults(enable_prefix_caching=False)
    args = parser.parse_args(argv)
    res = run(engine_args.build_engine(args), args)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    path = Path(args.out) / f"profile_step-b{args.batch_size}.json"
    path.write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
