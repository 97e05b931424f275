"""`python -m examples.bench throughput`: offline throughput, as `vllm bench throughput`.

Mirrors vllm/benchmarks/throughput.py (run_vllm, main): every request is queued at once
and the engine runs until all finish (LLM.generate); the timer wraps only that, not the
start-up. Sampling per request: temperature (1.0), top_p 1.0, ignore_eos (always, as
vLLM), max_tokens = the request's expected output length. Token counts come from the
returned outputs. Prints vLLM's lines

    Throughput: X requests/s, Y total tokens/s, Z output tokens/s
    Total num prompt tokens:  P
    Total num output tokens:  O

then the peak GPU memory (ours), and writes vLLM's JSON keys with --output-json.
Prompts are token ids from examples/bench/datasets.py (`random` by default, vLLM's
fallback without --dataset-path; or `sharegpt-synthetic`).
"""

from __future__ import annotations

import argparse
import time

from examples.bench import datasets, engine_args


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    datasets.add_dataset_args(parser)
    parser.add_argument("--temperature", type=float, default=1.0,
                        help="Sampling temperature (vLLM's throughput uses 1.0).")
    engine_args.add_run_args(parser, "throughput")
    engine_args.add_engine_args(parser)


def run(engine, args: argparse.Namespace) -> dict:
    """Sample the requests, run them, print vLLM's lines; the result dict."""
    requests = datasets.get_samples(args, engine.model_info.vocab_size,
                                    engine_args.bos_token_id(engine),
                                    engine_args.special_token_ids(engine))
    engine_args.check_max_model_len(
        engine, max(r.prompt_len + r.expected_output_len for r in requests))
    params = [engine_args.sampling_params(r.expected_output_len, args.temperature,
                                          detokenize=not args.disable_detokenize, n=args.n)
              for r in requests]
    start = time.perf_counter()
    outputs, _ = engine_args.generate(engine, [r.prompt for r in requests], params, "tp")
    elapsed = time.perf_counter() - start
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outputs)
    output_tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    total = prompt_tokens + output_tokens
    print(f"Throughput: {len(requests) / elapsed:.2f} requests/s, "
          f"{total / elapsed:.2f} total tokens/s, "
          f"{output_tokens / elapsed:.2f} output tokens/s")
    print(f"Total num prompt tokens:  {prompt_tokens}")
    print(f"Total num output tokens:  {output_tokens}")
    line, peak_gib = engine_args.peak_memory_line(engine)
    print(line)
    return {"elapsed_time": elapsed, "num_requests": len(requests),
            "total_num_tokens": total, "requests_per_second": len(requests) / elapsed,
            "tokens_per_second": total / elapsed,
            "output_tokens_per_second": output_tokens / elapsed,
            "total_prompt_tokens": prompt_tokens, "total_output_tokens": output_tokens,
            "peak_gpu_memory_gib": peak_gib}


def main(args: argparse.Namespace) -> dict:
    return engine_args.run_and_save(run, args)
