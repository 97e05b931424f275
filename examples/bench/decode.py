"""Decode throughput of the engine at a few batch sizes (greedy, ignore_eos).

    .venv/bin/python examples/bench/decode.py [MODEL] [--dtype float32] [--tokens 64]

Prints one line per batch size: output tokens per second over the decode steps only
(the prefill step is excluded). Results go to docs/BENCHMARKS.md with the command.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from libvllm.engine.config import EngineConfig  # noqa: E402
from libvllm.engine.llm_engine import LLMEngine  # noqa: E402
from libvllm.engine.sampling_params import RequestOutputKind, SamplingParams  # noqa: E402

DEFAULT_MODEL = Path.home() / ".cache/libvllm/models/SmolLM2-135M-Instruct.Q4_1.gguf"


def decode_tok_s(engine: LLMEngine, batch: int, tokens: int) -> float:
    for i in range(batch):
        engine.add_request(f"b{batch}-{i}", "Once upon a time", SamplingParams(
            temperature=0.0, max_tokens=tokens, ignore_eos=True,
            output_kind=RequestOutputKind.DELTA))
    engine.step()  # prefill (and the first token)
    start, n = time.perf_counter(), 0
    while engine.has_unfinished_requests():
        n += sum(len(o.outputs[0].token_ids) for o in engine.step())
    return n / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default=str(DEFAULT_MODEL))
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    args = ap.parse_args()
    engine = LLMEngine.from_config(EngineConfig(model=args.model, max_model_len=1024,
                                                dtype=args.dtype, device=args.device))
    decode_tok_s(engine, 1, 4)  # warm-up
    for b in args.batch:
        print(f"device={engine.device} dtype={args.dtype} batch={b} "
              f"decode={decode_tok_s(engine, b, args.tokens):.1f} tok/s")


if __name__ == "__main__":
    main()
