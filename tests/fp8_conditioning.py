"""The random models of the FP8 accuracy acceptance (tests/test_fp8_accuracy_gpu.py) and
their conditioning, measured on the CPU (helpers and a command, no tests here).

A teacher-forced top-1 is only as stable as its margin: with an lm_head independent of
the hidden state (random untied weights) the logits of a position are i.i.d. Gaussian
over the vocabulary whatever the weights' scale, and 11-16 % of the positions have a
top-1/top-2 gap under 0.05 of the logits' standard deviation (`python -m
tests.fp8_conditioning --untied --weight-std S` prints it for S = 0.0125, 0.05, 0.2),
where bf16 noise alone flips the top-1. The acceptance's models tie the embeddings (the
hidden state carries the current token's embedding, so its logit leads by a margin, as a
trained model's confident predictions do) and scale every matrix by WEIGHT_STD
(tests/test_models_parity.py / test_models_hybrid_gdn.py weight_std): small enough that
the layers rarely overturn that lead by a hair, large enough that they still move the
top-1 at some positions.

measure() runs transformers on the dequantized twin of the case's FP8 checkpoint
(tests/fp8_reference.py, the GPU test's 128 x 128 blocks, 8 seeded prompts of 64 ids):
  near_ties     fraction of positions whose fp32 emulation (tests/fp8_emulation.py) has a
                top-1/top-2 gap < NEAR_TIE x the std of that position's logits;
  bf16          top-1 agreement of the emulation run in bf16 with the fp32 emulation
                (the stand-in of the engine's own rounding noise);
  fp64          the same for the emulation in fp64 (the stand-in of an fp32 engine: the
                same quantized math, other roundings and summation order);
  twin, twin_ref  the twin criterion's stand-ins: bf16 emulation vs bf16 without the
                rounding, and bf16 vs fp32, both without the rounding;
  rounding_off  fp32 with the rounding off vs the fp32 emulation: how many top-1s the FP8
                activation rounding itself moves (the size of error the acceptance sees);
  current       fraction of positions whose emulation top-1 is the position's own token
                (the tied embedding's lead: 1 - current is where the layers decide);
  lp_fp64, lp_rounding_off  mean |log-probability of the actual next token| gap to the
                fp32 emulation of the fp64 emulation (an fp32 engine's noise) and of fp32
                without the rounding (an error the size of the FP8 rounding): the
                logprob criterion's bound lies between them, so it sees errors the top-1
                agreement cannot (the tied embedding decides most top-1s).
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers

from tests.fp8_emulation import (
    Fp8Emulation,
    agreement,
    hf_logits,
    hf_next_logprobs,
    mean_logprob_gap,
    random_prompts,
)
from tests.fp8_reference import write_fp8_pair
from tests.test_fp8_gpu import _hf

WEIGHT_STD = {"llama": 0.0125, "qwen3_moe": 0.0125, "qwen3_5_moe": 0.0225}
# the logprob criterion's bound per family: ~ the geometric mean of lp_fp64 (noise) and
# lp_rounding_off (an error) as `python -m tests.fp8_conditioning` prints them: 0.7e-4 to
# 5.1e-4 against 5.8e-3 to 8.4e-3 (Llama, Qwen3-MoE), 1.65e-2 against 5.05e-2 (Qwen3.5-MoE:
# the GDN recurrence carries the roundings' differences)
MAX_MEAN_LOGPROB_GAP = {"llama": 2e-3, "qwen3_moe": 2e-3, "qwen3_5_moe": 3e-2}
BLOCK = (128, 128)
PROMPTS, LENGTH = 8, 64
NEAR_TIE = 0.05
CASES = [("llama", "fp8-block"), ("llama", "ct-channel"), ("qwen3_moe", "fp8-block"),
         ("qwen3_moe", "ct-channel"), ("qwen3_5_moe", "fp8-block")]


def accuracy_model(family: str, tied: bool = True, std: float | None = None
                   ) -> torch.nn.Module:
    """The family's fp32 transformers model at tests/test_fp8_gpu.py's shapes, matrices
    N(0, std or WEIGHT_STD[family]), embeddings tied (untied: the comparison)."""
    return _hf(family, weight_std=std or WEIGHT_STD[family], tie_word_embeddings=tied)


def accuracy_prompts(vocab: int) -> list[list[int]]:
    return random_prompts(PROMPTS, LENGTH, vocab, seed=0)


def near_ties(logits: list[torch.Tensor]) -> float:
    """Fraction of rows ([n, V] each) whose top-1/top-2 gap is < NEAR_TIE x the row's std."""
    rows = torch.cat(logits)  # [P, V]
    top2 = rows.topk(2, dim=-1).values  # [P, 2]
    return ((top2[:, 0] - top2[:, 1]) < NEAR_TIE * rows.std(-1)).float().mean().item()


@dataclass
class Conditioning:
    near_ties: float
    bf16: float
    fp64: float
    twin: float
    twin_ref: float
    rounding_off: float
    current: float
    lp_fp64: float  # mean |next-token logprob| gap, fp64 emulation vs the fp32 one
    lp_rounding_off: float  # the same, fp32 without the rounding vs the fp32 emulation


def _top1(logits: list[torch.Tensor]) -> list[list[int]]:
    return [rows.argmax(-1).tolist() for rows in logits]


def measure(family: str, scheme: str, tied: bool = True, std: float | None = None
            ) -> Conditioning:
    """The conditioning of one case (module docstring), on the CPU."""
    with tempfile.TemporaryDirectory() as root:
        _, twin_dir = write_fp8_pair(accuracy_model(family, tied, std), Path(root), scheme,
                                     BLOCK)
        hf = transformers.AutoModelForCausalLM.from_pretrained(twin_dir, dtype=torch.float32)
    hf.eval()
    prompts = accuracy_prompts(hf.config.vocab_size)
    runs = {}
    for dtype in (torch.float32, torch.float64, torch.bfloat16):  # fp32 -> fp64 is exact
        hf.to(dtype)
        for rounding in (True, False):
            with Fp8Emulation(hf, scheme, BLOCK, rounding=rounding):
                runs[dtype, rounding] = hf_logits(hf, prompts)
    emulation = runs[torch.float32, True]
    top1 = {k: _top1(v) for k, v in runs.items()}
    ref = top1[torch.float32, True]
    own = [p[:-1] for p in prompts]  # the token at each scored position
    lp = {k: hf_next_logprobs(v, prompts) for k, v in runs.items()}
    lp_ref = lp[torch.float32, True]
    return Conditioning(
        near_ties(emulation), agreement(top1[torch.bfloat16, True], ref),
        agreement(top1[torch.float64, True], ref),
        agreement(top1[torch.bfloat16, True], top1[torch.bfloat16, False]),
        agreement(top1[torch.bfloat16, False], top1[torch.float32, False]),
        agreement(top1[torch.float32, False], ref), agreement(ref, own),
        mean_logprob_gap(lp[torch.float64, True], lp_ref),
        mean_logprob_gap(lp[torch.float32, False], lp_ref))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--untied", action="store_true", help="untied embeddings")
    parser.add_argument("--weight-std", type=float, help="every family's (WEIGHT_STD)")
    args = parser.parse_args()
    for family, scheme in CASES:
        c = measure(family, scheme, not args.untied, args.weight_std)
        std = args.weight_std or WEIGHT_STD[family]
        print(f"{family} {scheme} std {std}: near-ties {c.near_ties:.4f}, "
              f"bf16 vs fp32 emulation {c.bf16:.4f}, fp64 vs fp32 emulation {c.fp64:.4f}, "
              f"twin {c.twin:.4f} vs {c.twin_ref:.4f}, rounding off {c.rounding_off:.4f}, "
              f"top-1 = own token {c.current:.4f}, logprob gap fp64 {c.lp_fp64:.2e} "
              f"rounding off {c.lp_rounding_off:.2e}",
              flush=True)


if __name__ == "__main__":
    main()
