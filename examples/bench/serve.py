"""`python -m examples.bench serve`: online serving benchmark, as `vllm bench serve`.

Mirrors vllm/benchmarks/serve.py (get_request, benchmark) and the `openai` backend of
vllm/benchmarks/lib/endpoint_request_func.py against a running OpenAI server (ours:
examples/server). Each request is a streamed /v1/completions call with
stream_options.include_usage, repetition_penalty 1.0, max_tokens = the expected output
length, `ignore_eos` only with --ignore-eos and `temperature` only with --temperature (the
server's default otherwise), as vLLM. Prompts are token-id lists (OpenAI's token prompt)
from examples/bench/datasets.py with ids below --vocab-size and no BOS, since the client
has no tokenizer; the server takes token prompts as they are, so --input-len is the
prompt length the engine sees.

Arrivals: --request-rate inf sends all at t=0; otherwise gamma inter-arrival times with
shape --burstiness (1.0: Poisson), rescaled so the last one lands at N / rate, as vLLM.
--max-concurrency caps the requests in flight. The run starts with vLLM's single-prompt
test request (and --num-warmups more); metrics and the printed block are those of
examples/bench/serve_metrics.py. --save-result (vLLM) or --output-json writes the JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import time
from datetime import datetime

import numpy as np

from examples.bench import datasets, http_client
from examples.bench.serve_metrics import RequestFuncOutput, calculate_metrics, format_result


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    datasets.add_dataset_args(parser)
    parser.add_argument("--backend", choices=("openai",), default="openai")
    parser.add_argument("--base-url", default=None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--endpoint", default="/v1/completions")
    parser.add_argument("--model", default=None,
                        help="Served model name; default: the first of /v1/models.")
    parser.add_argument("--vocab-size", type=int, default=10000,
                        help="Prompt token ids are drawn below this (ours: no tokenizer).")
    parser.add_argument("--request-rate", type=float, default=float("inf"))
    parser.add_argument("--burstiness", type=float, default=1.0)
    parser.add_argument("--max-concurrency", type=int, default=None)
    parser.add_argument("--num-warmups", type=int, default=0)
    parser.add_argument("--ignore-eos", action="store_true")
    parser.add_argument("--temperature", type=float, default=None)
    parser.add_argument("--percentile-metrics", default="ttft,tpot,itl")
    parser.add_argument("--metric-percentiles", default="99")
    parser.add_argument("--goodput", nargs="+", default=None, metavar="KEY:VALUE")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save-result", action="store_true")
    parser.add_argument("--result-dir", default=None)
    parser.add_argument("--result-filename", default=None)
    parser.add_argument("--output-json", default=None)
    parser.set_defaults(random_input_len=1024, random_output_len=128)


def parse_goodput(pairs: list[str] | None) -> dict[str, float]:
    out: dict[str, float] = {}
    for pair in pairs or []:
        name, _, value = pair.partition(":")
        if name not in ("ttft", "tpot", "e2el") or not value:
            raise argparse.ArgumentTypeError(
                'Specify service level objectives for goodput as "KEY:VALUE" pairs, where '
                "the key is one of ttft, tpot, e2el and the value is in milliseconds.")
        if float(value) < 0:
            raise argparse.ArgumentTypeError(f"Invalid value found, {name}: {value}.")
        out[name] = float(value)
    return out


def arrival_times(n: int, request_rate: float, burstiness: float,
                  rng: np.random.Generator) -> list[float]:
    """Send offsets in seconds from the start (vLLM's get_request, no ramp-up)."""
    if burstiness <= 0:
        raise ValueError(f"A positive burstiness factor is expected, but given {burstiness}.")
    if request_rate == float("inf"):
        return [0.0] * n
    if burstiness == float("inf"):
        gaps = np.full(n, 1.0 / request_rate)
    else:
        gaps = rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=n)
    delays = np.cumsum(gaps)
    if delays[-1] != 0:
        delays *= (n / request_rate) / delays[-1]
    return delays.tolist()


async def request_completion(api_url: str, payload: dict, prompt_len: int
                             ) -> RequestFuncOutput:
    """One streamed completion, timed as vLLM's async_request_openai_completions."""
    out = RequestFuncOutput(prompt_len=prompt_len)
    st = time.perf_counter()
    out.start_time = most_recent = st
    text: list[str] = []
    try:
        async for data in http_client.stream_sse(api_url, payload):
            if data == "[DONE]":
                continue
            chunk = json.loads(data)
            if choices := chunk.get("choices"):
                now = time.perf_counter()
                if not out.success:
                    out.success, out.ttft = True, now - st
                else:
                    out.itl.append(now - most_recent)
                most_recent = now
                text.append(choices[0].get("text") or "")
            elif usage := chunk.get("usage"):
                out.output_tokens = usage.get("completion_tokens") or 0
        if not out.success:
            out.error = ("Never received a valid chunk to calculate TTFT.This response will "
                         "be marked as failed!")
        out.latency = most_recent - st
        out.generated_text = "".join(text)
    except Exception as exc:  # noqa: BLE001 (a failed request is a result, as vLLM's)
        out.success, out.error = False, f"{type(exc).__name__}: {exc}"
    return out


def _payload(args: argparse.Namespace, model: str, req: datasets.SampleRequest) -> dict:
    payload = {"model": model, "prompt": req.prompt, "repetition_penalty": 1.0,
               "max_tokens": req.expected_output_len, "stream": True,
               "stream_options": {"include_usage": True}}
    if args.ignore_eos:
        payload["ignore_eos"] = True
    if args.temperature is not None:
        payload["temperature"] = args.temperature
    return payload


async def benchmark(args: argparse.Namespace) -> dict:
    base_url = args.base_url or f"http://{args.host}:{args.port}"
    api_url = base_url + args.endpoint
    model = args.model or (await http_client.request_json(base_url + "/v1/models"))[
        "data"][0]["id"]
    requests = datasets.get_samples(args, args.vocab_size, None)
    percentiles = [float(p) for p in args.metric_percentiles.split(",")]
    goodput = parse_goodput(args.goodput)
    print("Starting initial single prompt test run...")
    test = await request_completion(api_url, _payload(args, model, requests[0]),
                                    requests[0].prompt_len)
    if not test.success:
        raise ValueError("Initial test run failed - Please make sure benchmark arguments are "
                         f"correctly specified. Error: {test.error}")
    print("Initial test run completed.")
    if args.num_warmups > 0:
        print(f"Warming up with {args.num_warmups} requests...")
        await asyncio.gather(*[request_completion(api_url, _payload(args, model, requests[0]),
                                                  requests[0].prompt_len)
                               for _ in range(args.num_warmups)])
        print("Warmup run completed.")
    print("Starting main benchmark run...")
    distribution = "Poisson process" if args.burstiness == 1.0 else "Gamma distribution"
    print(f"Traffic request rate: {args.request_rate}")
    print(f"Burstiness factor: {args.burstiness} ({distribution})")
    print(f"Maximum request concurrency: {args.max_concurrency}")
    offsets = arrival_times(len(requests), args.request_rate, args.burstiness,
                            np.random.default_rng(args.seed))
    semaphore = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency \
        else contextlib.nullcontext()

    async def limited(req: datasets.SampleRequest) -> RequestFuncOutput:
        async with semaphore:
            return await request_completion(api_url, _payload(args, model, req),
                                            req.prompt_len)

    start = time.perf_counter()
    tasks = []
    for req, offset in zip(requests, offsets):
        if (wait := start + offset - time.perf_counter()) > 0:
            await asyncio.sleep(wait)
        tasks.append(asyncio.create_task(limited(req)))
    outputs = await asyncio.gather(*tasks)
    duration = time.perf_counter() - start
    failed = [o for o in outputs if not o.success]
    if failed:
        print("Failed requests during benchmark run detected (capping to 10):")
        for i, o in enumerate(failed[:10]):
            print(f"Error {i}: {o.error}")
    metrics = calculate_metrics(outputs, duration, percentiles, goodput)
    print(format_result(metrics, args.max_concurrency, args.request_rate,
                        args.percentile_metrics.split(","), percentiles, bool(goodput)))
    return metrics | {"model_id": model, "num_prompts": len(requests),
                      "request_rate": args.request_rate, "burstiness": args.burstiness,
                      "max_concurrency": args.max_concurrency,
                      "input_lens": [o.prompt_len for o in outputs],
                      "output_lens": [o.output_tokens for o in outputs],
                      "ttfts": [o.ttft for o in outputs], "itls": [o.itl for o in outputs],
                      "errors": [o.error for o in outputs]}


def main(args: argparse.Namespace) -> dict:
    result = asyncio.run(benchmark(args))
    path = args.output_json
    if args.save_result and not path:
        rate = args.request_rate
        conc = f"-concurrency{args.max_concurrency}" if args.max_concurrency else ""
        path = args.result_filename or (
            f"{args.backend}-{rate}qps{conc}-{result['model_id'].split('/')[-1]}-"
            f"{datetime.now().strftime('%Y%m%d-%H%M%S')}.json")
        if args.result_dir:
            os.makedirs(args.result_dir, exist_ok=True)
            path = os.path.join(args.result_dir, path)
    if path:
        with open(path, "w") as f:
            json.dump(result, f)
    return result
