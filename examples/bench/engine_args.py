"""Engine flags of the benchmarks, with vLLM's names and defaults, and the engine they build.

Mirrors the subset of vllm/engine/arg_utils.py (EngineArgs.add_cli_args) that
engine.config.EngineConfig has. The engine (and torch, where it runs in this process) is
imported only when the engine is built, so `startup` can time those imports. Helpers
shared by the offline benchmarks: building the engine, running a list of token-id
requests to completion (vLLM's LLM.generate), and the peak GPU memory line.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

DEFAULT_MODEL = str(Path.home() / ".cache/libvllm/models/SmolLM2-135M-Instruct.Q4_1.gguf")


def add_run_args(parser: argparse.ArgumentParser, results: str) -> None:
    """The flags `latency` and `throughput` share (vLLM spells them alike in both)."""
    parser.add_argument("--n", type=int, default=1,
                        help="Number of generated sequences per prompt.")
    parser.add_argument("--disable-detokenize", action="store_true")
    parser.add_argument("--output-json", default=None,
                        help=f"Path to save the {results} results in JSON format.")


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    B = argparse.BooleanOptionalAction
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help="GGUF file or Hugging Face directory (a config.json directory "
                             "with --load-format dummy)")
    parser.add_argument("--tokenizer", default=None)
    parser.add_argument("--skip-tokenizer-init", action="store_true")
    parser.add_argument("--load-format", choices=("auto", "dummy"), default="auto")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"),
                        default="auto")
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--max-num-seqs", type=int, default=None)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument("--block-size", type=int, default=None)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--kv-cache-memory-bytes", type=int, default=None)
    parser.add_argument("--enable-prefix-caching", action=B, default=None)
    parser.add_argument("--enable-chunked-prefill", action=B, default=None)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--async-scheduling", action=B, default=None,
                        help="overlap scheduling with the device step (default: on with "
                             "CUDA)")
    parser.add_argument("--multiprocessing", action=B, default=None,
                        help="the engine core in its own process (vLLM's "
                             "VLLM_ENABLE_V1_MULTIPROCESSING; default: on with CUDA)")
    parser.add_argument("--cudagraph-mode", default=None,
                        choices=["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY",
                                 "FULL_AND_PIECEWISE"],
                        help="vLLM's -cc.cudagraph_mode (default: FULL_AND_PIECEWISE)")
    parser.add_argument("--cudagraph-capture-sizes", type=int, nargs="+", default=None)
    parser.add_argument("--max-cudagraph-capture-size", type=int, default=None)
    parser.add_argument("--quantization", "-q", default=None,
                        help="vLLM's --quantization (fp8: online FP8 of a bf16 checkpoint)")
    parser.add_argument("--kv-cache-dtype", default=None, help="auto | fp8 | fp8_e4m3")
    parser.add_argument("--mamba-ssm-cache-dtype", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=None,
                        help="vLLM's tensor parallelism: ranks to shard the model over")


_FIELDS = ("tokenizer", "skip_tokenizer_init", "load_format", "device", "dtype",
           "max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size",
           "gpu_memory_utilization", "kv_cache_memory_bytes", "enable_prefix_caching",
           "enable_chunked_prefill", "enforce_eager", "async_scheduling",
           "multiprocessing", "cudagraph_mode", "cudagraph_capture_sizes",
           "max_cudagraph_capture_size", "quantization", "kv_cache_dtype",
           "mamba_ssm_cache_dtype", "seed", "tensor_parallel_size")


def engine_config(args: argparse.Namespace):
    """EngineConfig from the parsed flags; a flag left at None keeps the engine's default."""
    from libvllm.engine.config import EngineConfig

    kwargs = {f: getattr(args, f) for f in _FIELDS if getattr(args, f, None) is not None}
    return EngineConfig(model=args.model, **kwargs)


def build_engine(args: argparse.Namespace):
    from libvllm.engine.llm_engine import LLMEngine

    return LLMEngine.from_config(engine_config(args))


def bos_token_id(engine) -> int | None:
    bos = engine.model_info.bos_token_id
    return None if bos < 0 else bos


def special_token_ids(engine) -> tuple[int, ...]:
    """Ids a random prompt must avoid (vLLM: tokenizer.all_special_ids); none without one."""
    ids = {engine.model_info.bos_token_id, engine.model_info.eos_token_id}
    return tuple(sorted(i for i in ids if i >= 0))


def sampling_params(max_tokens: int, temperature: float = 1.0, ignore_eos: bool = True,
                    detokenize: bool = True, n: int = 1):
    """vLLM's offline-benchmark SamplingParams: temperature 1.0, top_p 1.0, ignore_eos,
    max_tokens = the expected output length; outputs only when finished (LLM.generate)."""
    from libvllm.engine.sampling_params import RequestOutputKind, SamplingParams

    return SamplingParams(n=n, temperature=temperature, top_p=1.0, ignore_eos=ignore_eos,
                          max_tokens=max_tokens, detokenize=detokenize,
                          output_kind=RequestOutputKind.FINAL_ONLY)


def generate(engine, prompts: list[list[int]], params: list, tag: str = "r"
             ) -> tuple[list, float | None]:
    """Run every request to completion, as vLLM's LLM.generate. Returns (finished
    RequestOutputs in prompt order, seconds from the call to the end of the first step,
    in which the first tokens of the prompts admitted at once are sampled: with async
    scheduling the step() call that took that step's output, not the one that queued it)."""
    start = time.perf_counter()
    ids = [f"{tag}{i}" for i in range(len(prompts))]
    for rid, prompt, sp in zip(ids, prompts, params):
        engine.add_request(rid, prompt, sp)
    done: dict[str, object] = {}
    first_step = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
        if first_step is None and first_tokens_sampled(engine):
            first_step = time.perf_counter() - start
    return [done[rid] for rid in ids], first_step


def first_tokens_sampled(engine) -> bool:
    """Whether a step's sampled tokens have reached the front end (or all finished)."""
    states = engine.output_processor.request_states.values()
    return not states or any(s.detokenizer.output_token_ids for s in states)


def peak_memory_line(engine) -> tuple[str, float | None]:
    """("Peak GPU memory: X GiB ...", GiB) from the engine core's torch allocator (in the
    core's process, a child by default on CUDA); n/a without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return "Peak GPU memory: n/a (no CUDA device)", None
    gib = engine.peak_memory_bytes() / (1 << 30)
    return f"Peak GPU memory: {gib:.2f} GiB (torch allocator, KV cache included)", gib


def check_max_model_len(engine, needed: int) -> None:
    if engine.max_model_len < needed:
        sys.exit("Please ensure that max_model_len is greater than the sum of prompt_len and "
                 f"expected_output_len for all requests ({engine.max_model_len} < {needed}).")


def run_and_save(run, args: argparse.Namespace) -> dict:
    """Build the engine, run one benchmark on it, write --output-json; its result dict."""
    import json

    results = run(build_engine(args), args)
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(results, f, indent=4)
    return results
