"""SamplingMetadata: per-step sampling inputs for the batch, as vllm/v1/sample/metadata.py.

build_sampling_metadata plays the part of vLLM's InputBatch._make_sampling_metadata:
from each row's SamplingParams and token ids it builds the tensors (on the logits'
device) that the Sampler applies in one batched op each. Optional parts are None /
empty when no row of the step uses them, so an ordinary batch pays nothing for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from libvllm.engine.sample.ops.thinking_budget import (
    ThinkingBudgetTargets,
    ThinkingScan,
    thinking_budget_targets,
)
from libvllm.engine.sample.ops.torch_utils import async_tensor_h2d, make_tensor_with_pad
from libvllm.engine.sampling_params import SamplingParams, SamplingType


@dataclass
class SamplingMetadata:
    temperature: torch.Tensor | None  # [num_reqs] fp32; None when all greedy
    all_greedy: bool
    all_random: bool
    top_p: torch.Tensor | None = None  # [num_reqs] fp32; None when no row uses it
    top_k: torch.Tensor | None = None  # [num_reqs] int64 (vocab size = off)
    min_p: torch.Tensor | None = None  # [num_reqs] fp32
    generators: dict[int, torch.Generator] = field(default_factory=dict)  # row -> seeded
    max_num_logprobs: int | None = None  # None: no logprobs; 0: the sampled token only
    no_penalties: bool = True
    prompt_token_ids: torch.Tensor | None = None  # [num_reqs, max_prompt] padded with vocab
    frequency_penalties: torch.Tensor | None = None  # [num_reqs] fp32
    presence_penalties: torch.Tensor | None = None  # [num_reqs] fp32
    repetition_penalties: torch.Tensor | None = None  # [num_reqs] fp32
    output_token_ids: list[list[int]] = field(default_factory=list)  # per row; -1: in flight
    # [num_reqs] each row's last token S[-1] on the device (it may be in flight: the -1s),
    # read by penalties and the thinking budget
    last_token_ids: torch.Tensor | None = None
    allowed_token_ids_mask: torch.Tensor | None = None  # [num_reqs, vocab] bool, True = banned
    bad_words_token_ids: dict[int, list[list[int]]] = field(default_factory=dict)  # row -> words
    min_tokens: dict[int, set[int]] = field(default_factory=dict)  # row -> blocked stop ids
    logit_bias: dict[int, dict[int, float]] = field(default_factory=dict)  # row -> bias
    # rows asking for given ids' logprobs (logprob_token_ids) instead of the top-k;
    # -1-padded, so a row of -1 (no ids) keeps its top-k
    logprob_token_ids: torch.Tensor | None = None  # [num_reqs, max ids] int64
    # rows with a thinking_token_budget: what each must take, by its last token
    thinking_budget_targets: ThinkingBudgetTargets | None = None


def has_penalties(sp: SamplingParams) -> bool:
    return bool(sp.presence_penalty or sp.frequency_penalty or sp.repetition_penalty != 1.0)


def reads_output_token_ids(sp: SamplingParams) -> bool:
    """Bad words match the ids sampled so far on the host (penalties count them on the
    device, the token in flight included)."""
    return bool(sp.bad_words_token_ids)


def build_sampling_metadata(sps: list[SamplingParams], token_ids: list[list[int]],
                            num_prompt_tokens: list[int],
                            generators: dict[int, torch.Generator], vocab_size: int,
                            device: torch.device,
                            thinking_scans: list[ThinkingScan] | None = None,
                            last_token_ids: torch.Tensor | None = None) -> SamplingMetadata:
    """sps / token_ids (prompt + output so far; the last may be in flight) /
    num_prompt_tokens: one entry per row; thinking_scans: each row's request's marker scan
    (fresh ones when None); last_token_ids: [num_reqs] each row's last token on the device
    (None: token_ids' last entries)."""
    greedy = [sp.sampling_type == SamplingType.GREEDY for sp in sps]
    num_outputs = [len(ids) - n for ids, n in zip(token_ids, num_prompt_tokens, strict=True)]

    def floats(values: list[float]) -> torch.Tensor:
        return async_tensor_h2d(values, torch.float32, device)

    md = SamplingMetadata(
        temperature=None if all(greedy) else floats([sp.temperature for sp in sps]),
        all_greedy=all(greedy), all_random=not any(greedy), generators=generators)
    if any(sp.top_p < 1.0 for sp in sps):
        md.top_p = floats([sp.top_p for sp in sps])
    if any(0 < sp.top_k < vocab_size for sp in sps):
        md.top_k = async_tensor_h2d([sp.top_k if 0 < sp.top_k < vocab_size else vocab_size
                                     for sp in sps], torch.long, device)
    if any(sp.min_p > 0.0 for sp in sps):
        md.min_p = floats([sp.min_p for sp in sps])
    wanted = [vocab_size if sp.logprobs == -1 else min(sp.logprobs, vocab_size)
              for sp in sps if sp.logprobs is not None and not sp.logprob_token_ids]
    md.max_num_logprobs = max(wanted, default=None)
    if any(sp.logprob_token_ids for sp in sps):
        md.logprob_token_ids = make_tensor_with_pad(
            [sp.logprob_token_ids or [] for sp in sps], -1, device)
    if any(has_penalties(sp) for sp in sps):
        md.no_penalties = False
        md.prompt_token_ids = make_tensor_with_pad(
            [ids[:n] for ids, n in zip(token_ids, num_prompt_tokens, strict=True)],
            vocab_size, device)
        md.frequency_penalties = floats([sp.frequency_penalty for sp in sps])
        md.presence_penalties = floats([sp.presence_penalty for sp in sps])
        md.repetition_penalties = floats([sp.repetition_penalty for sp in sps])
    md.bad_words_token_ids = {i: sp.bad_words_token_ids for i, sp in enumerate(sps)
                              if sp.bad_words_token_ids}
    if not md.no_penalties or md.bad_words_token_ids:  # both read the outputs so far
        md.output_token_ids = [ids[n:] for ids, n in zip(token_ids, num_prompt_tokens)]
    allowed = {i: sp.allowed_token_ids for i, sp in enumerate(sps) if sp.allowed_token_ids}
    if allowed:
        md.allowed_token_ids_mask = _allowed_token_ids_mask(allowed, len(sps), vocab_size, device)
    md.min_tokens = {i: {t for t in sp.all_stop_token_ids if 0 <= t < vocab_size}
                     for i, (sp, num) in enumerate(zip(sps, num_outputs, strict=True))
                     if num < sp.min_tokens and sp.all_stop_token_ids}
    md.logit_bias = {i: sp.logit_bias for i, sp in enumerate(sps) if sp.logit_bias}
    if any(sp.thinking_token_budget is not None for sp in sps):
        md.thinking_budget_targets = thinking_budget_targets(
            [sp.thinking_token_budget for sp in sps], [sp.reasoning_token_ids for sp in sps],
            token_ids, thinking_scans or [ThinkingScan() for _ in sps], device)
    if not md.no_penalties or md.thinking_budget_targets is not None:
        md.last_token_ids = last_token_ids if last_token_ids is not None else \
            async_tensor_h2d([ids[-1] for ids in token_ids], torch.long, device)
    return md


def _allowed_token_ids_mask(allowed: dict[int, list[int]], num_reqs: int, vocab_size: int,
                            device: torch.device) -> torch.Tensor:
    mask = torch.zeros((num_reqs, vocab_size), dtype=torch.bool, device=device)
    # device scalars: a Python bool would be copied from pageable memory (a host sync)
    mask.index_put_((async_tensor_h2d(list(allowed), torch.long, device),),
                    mask.new_ones(()))
    index = async_tensor_h2d([[r for r, ids in allowed.items() for _ in ids],
                              [t for ids in allowed.values() for t in ids]], torch.long, device)
    mask.index_put_((index[0], index[1]), mask.new_zeros(()))
    return mask
