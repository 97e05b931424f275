"""How far a GGUF model on a device strays from the fp32 CPU engine .

    python examples/bench/gguf_parity.py --model FILE.gguf [--device cuda] [--dtype bfloat16]
        [--max-tokens 32] [--out DIR]

On CUDA the GGUF linear weights stay quantized (kernels/gguf_mmvq.py up to 8 tokens, with
int8 activations; kernels/gguf_gemm.py beyond). The reference is the CPU engine in fp32,
which dequantizes the weights at load and matches transformers fp32 token for token
(tests/test_generate_parity.py). Per prompt (plain text, below): the reference's greedy
continuation; the device engine's greedy continuation and the position of the first token
that differs; then the device engine scores prompt + reference continuation with
prompt_logprobs=1 (teacher forcing): top-1 agreement (its argmax is the reference's next
token) and the largest |difference| between the two engines' logprobs of the reference
tokens. Prints a table and writes gguf_parity.json to --out (default $OUT or .).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.bench.engine_args import generate  # noqa: E402
from libvllm.engine.config import EngineConfig  # noqa: E402
from libvllm.engine.llm_engine import LLMEngine  # noqa: E402
from libvllm.engine.sampling_params import SamplingParams  # noqa: E402

PROMPTS = ["The capital of France is", "The quick brown fox",
           "Write a short poem about the sea.", "def fibonacci(n):"]


def run(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> list:
    """RequestOutput of each prompt, in order."""
    return generate(engine, prompts, [params] * len(prompts))[0]


def scored(engine: LLMEngine, prompts: list[list[int]]) -> list[list[tuple[int, float]]]:
    """Teacher-forced: per prompt, for every position after the first, (argmax token, logprob
    of the actual next token)."""
    out = []
    for o in run(engine, prompts, SamplingParams(max_tokens=1, prompt_logprobs=1)):
        rows = []
        for tok, pos in zip(o.prompt_token_ids[1:], o.prompt_logprobs[1:], strict=True):
            top = next(t for t, lp in pos.items() if lp.rank == 1)
            rows.append((top, pos[tok].logprob))
        out.append(rows)
    return out


def compare(model: str, device: str, dtype: str, max_tokens: int) -> dict:
    def engine(dev: str, dt: str) -> LLMEngine:
        return LLMEngine.from_config(EngineConfig(model=model, device=dev, dtype=dt,
                                                  max_model_len=1024, max_num_seqs=4))

    ref_engine = engine("cpu", "float32")
    prompts = [ref_engine.tokenizer.encode(p) for p in PROMPTS]
    greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    ref = [o.outputs[0].token_ids for o in run(ref_engine, prompts, greedy)]
    forced = [p + r for p, r in zip(prompts, ref, strict=True)]
    ref_scores = scored(ref_engine, forced)
    del ref_engine
    dev_engine = engine(device, dtype)
    got = [o.outputs[0].token_ids for o in run(dev_engine, prompts, greedy)]
    dev_scores = scored(dev_engine, forced)
    rows = []
    for p, r, g, rs, ds in zip(prompts, ref, got, ref_scores, dev_scores, strict=True):
        first_diff = next((i for i, (a, b) in enumerate(zip(r, g)) if a != b), None)
        cont = range(len(p) - 1, len(rs))  # positions that predict the continuation
        agree = sum(ds[i][0] == forced_tok for i, forced_tok in zip(cont, r)) / len(r)
        diff = max(abs(rs[i][1] - ds[i][1]) for i in range(len(rs)))
        rows.append({"prompt_tokens": len(p), "greedy_equal": first_diff is None,
                     "first_difference_at": first_diff, "top1_agreement": agree,
                     "max_logprob_diff": diff})
    return {"model": model, "device": device, "dtype": dtype, "max_tokens": max_tokens,
            "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    res = compare(args.model, args.device, args.dtype, args.max_tokens)
    print(f"{Path(args.model).name} on {args.device} {args.dtype} vs cpu float32")
    for text, r in zip(PROMPTS, res["rows"], strict=True):
        print(f"  {text[:32]:<34} greedy equal {str(r['greedy_equal']):<5} first diff "
              f"{r['first_difference_at']!s:<5} top-1 {r['top1_agreement']:.3f} "
              f"max |dlogprob| {r['max_logprob_diff']:.4f}")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "gguf_parity.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
