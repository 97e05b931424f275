"""The fp32 emulation of FP8 inference that the GPU accuracy acceptance compares against,
and teacher-forced top-1 agreement (helpers, no tests here).

Fp8Emulation: while active, transformers' fp32 model (loaded from the dequantized twin of
tests/fp8_reference.py) rounds the input of every quantized linear through float8_e4m3fn
the way the FP8 kernels round their activations, dequantizes it back to fp32 and runs the
original linear; weights are already the dequantized FP8 ones. The roundings are the
kernels' own torch references (kernels/fp8_quant.py): block FP8 per token group of block_k
along K (per_token_group_quant_fp8_ref, what the block GEMM / GEMV and the fused MoE with
a block_shape quantize), per token over the whole row with compressed-tensors FP8_DYNAMIC
(scaled_fp8_quant_ref per token, the per-channel linear's and MoE's), the static
input_scale per tensor. Mechanism: torch.nn.functional.linear is patched; a call is
rounded when its weight lives in the storage of a quantized parameter: an nn.Linear weight
named as tests/fp8_reference.py QUANTIZED, or transformers' fused experts' gate_up_proj /
down_proj, of which the eager experts pass one expert's slice to F.linear (the experts are
switched to transformers' "eager" implementation while active: grouped_mm calls no
F.linear). lm_head, routers, embeddings, GDN in_proj_a / in_proj_b and the shared-expert
gate keep their exact fp32 input.

Teacher forcing as examples/bench/gguf_parity.py scored() (vLLM's prompt_logprobs=1 and
the rank-1 token): top-1 of position i is the model's argmax for token i given tokens < i.
Mirrors the accuracy intent of vLLM 0.33 tests/quantization/test_fp8.py (FP8 layers
against the dequantized reference) with a token-level oracle in place of hub models.
"""

from __future__ import annotations

import re
from collections import Counter

import torch

from examples.bench.gguf_parity import scored
from libvllm.kernels.fp8_quant import (
    dequantize_fp8,
    per_token_group_quant_fp8_ref,
    scaled_fp8_quant_ref,
)
from tests.fp8_reference import INPUT_SCALE, QUANTIZED

EXPERTS = re.compile(r"\.experts\.(gate_up_proj|down_proj)$")  # transformers' fused [E, ., .]
SCHEMES = ("fp8-block", "ct-block", "ct-channel", "ct-tensor")


def round_activations(x: torch.Tensor, scheme: str, block_k: int) -> torch.Tensor:
    """x [..., K] -> x rounded through float8_e4m3fn and dequantized, [..., K] in x's dtype,
    with the scale the kernel's activation quantizer of `scheme` computes."""
    k = x.shape[-1]
    x2 = x.reshape(-1, k)  # [M, K]
    if scheme in ("fp8-block", "ct-block"):
        if k % block_k:
            raise ValueError(f"K = {k} is not a multiple of block_k = {block_k} (the "
                             "per-token-group quantizer needs whole groups)")
        q, s = per_token_group_quant_fp8_ref(x2, block_k)  # [M, K], [M, K / bk]
        out = dequantize_fp8(q, s, [1, block_k])
    elif scheme == "ct-channel":
        q, s = scaled_fp8_quant_ref(x2, use_per_token_if_dynamic=True)  # [M, K], [M, 1]
        out = q.float() * s
    elif scheme == "ct-tensor":
        scale = torch.tensor([INPUT_SCALE], device=x.device)  # static, [1]
        q, s = scaled_fp8_quant_ref(x2, scale)
        out = q.float() * s
    else:
        raise ValueError(f"unknown FP8 scheme {scheme!r}, expected one of {SCHEMES}")
    return out.reshape(x.shape).to(x.dtype)


def quantized_parameters(model: torch.nn.Module) -> dict[int, str]:
    """Storage address -> name of every parameter the FP8 checkpoint quantizes."""
    return {p.untyped_storage().data_ptr(): name for name, p in model.named_parameters()
            if QUANTIZED.search(name) or EXPERTS.search(name)}


class Fp8Emulation:
    """`with Fp8Emulation(hf_model, scheme, block):` runs hf_model with the FP8 kernels'
    activation rounding (rounding=False: the experts' eager path only, nothing rounded).
    counts: Counter of quantized-parameter name -> F.linear calls seen; with record=True,
    records holds (name, input, rounded input) of each call."""

    def __init__(self, model: torch.nn.Module, scheme: str, block=(128, 128),
                 rounding: bool = True, record: bool = False) -> None:
        if scheme not in SCHEMES:
            raise ValueError(f"unknown FP8 scheme {scheme!r}, expected one of {SCHEMES}")
        self.model, self.scheme, self.block_k = model, scheme, block[1]
        self.rounding, self.record = rounding, record
        self.counts: Counter[str] = Counter()
        self.records: list[tuple[str, torch.Tensor, torch.Tensor]] = []

    def _linear(self, x: torch.Tensor, weight: torch.Tensor, bias=None) -> torch.Tensor:
        name = self._quantized.get(weight.untyped_storage().data_ptr())
        if name is not None:
            self.counts[name] += 1
            if self.rounding:
                xr = round_activations(x, self.scheme, self.block_k)
                if self.record:
                    self.records.append((name, x.detach().clone(), xr.detach().clone()))
                x = xr
        return self._original(x, weight, bias)

    def __enter__(self) -> Fp8Emulation:
        self._quantized = quantized_parameters(self.model)
        self._experts = self.model.config._experts_implementation
        self.model.set_experts_implementation("eager")
        self._original = torch.nn.functional.linear
        torch.nn.functional.linear = self._linear
        return self

    def __exit__(self, *exc) -> None:
        torch.nn.functional.linear = self._original
        self.model.set_experts_implementation(self._experts)


def hf_logits(model: torch.nn.Module, prompts: list[list[int]]) -> list[torch.Tensor]:
    """Teacher-forced logits of a transformers model: per prompt of n tokens, [n - 1, V]
    fp32, row i the logits at position i (predicting token i + 1)."""
    out = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])  # [1, n]; an explicit mask: token 0 is the pad id
            logits = model(ids, attention_mask=torch.ones_like(ids)).logits[0]  # [n, V]
            out.append(logits[:-1].float())
    return out


def hf_top1(model: torch.nn.Module, prompts: list[list[int]]) -> list[list[int]]:
    """Teacher-forced argmax of a transformers model: per prompt, for tokens 1..n-1 the
    argmax of the logits at the position before."""
    return [rows.argmax(-1).tolist() for rows in hf_logits(model, prompts)]


def hf_next_logprobs(logits: list[torch.Tensor], prompts: list[list[int]]
                     ) -> list[list[float]]:
    """From hf_logits' rows: per prompt, the log-probability of each actual next token."""
    return [torch.log_softmax(rows.double(), -1)[torch.arange(len(p) - 1), p[1:]].tolist()
            for rows, p in zip(logits, prompts, strict=True)]


def engine_top1(engine, prompts: list[list[int]]) -> list[list[int]]:
    """The engine's teacher-forced argmax (prompt_logprobs=1, rank 1), aligned as hf_top1."""
    return engine_scored(engine, prompts)[0]


def engine_scored(engine, prompts: list[list[int]]
                  ) -> tuple[list[list[int]], list[list[float]]]:
    """(teacher-forced argmax, log-probability of each actual next token), as hf_top1 and
    hf_next_logprobs align them."""
    rows = scored(engine, prompts)
    return [[t for t, _ in r] for r in rows], [[lp for _, lp in r] for r in rows]


def mean_logprob_gap(a: list[list[float]], b: list[list[float]]) -> float:
    """Mean |a - b| over every position of two next-token logprob lists."""
    pairs = [(x, y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True)]
    return sum(abs(x - y) for x, y in pairs) / len(pairs)


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Fraction of positions where two teacher-forced top-1 lists agree."""
    pairs = [(x, y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True)]
    return sum(x == y for x, y in pairs) / len(pairs)


def random_prompts(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """n prompts of `length` token ids drawn uniformly from [0, vocab), seeded."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n, length), generator=g).tolist()
