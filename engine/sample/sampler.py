"""Sampler: logits -> next token ids (+ logprobs) for the whole batch, on the logits' device.

Mirrors vllm/v1/sample/sampler.py, in vLLM's order:
1. raw logprobs (logprobs_mode "raw_logprobs"): log_softmax of the logits before any
   processing, when some row asked for logprobs;
2. allowed_token_ids mask, bad words, min_tokens, logit_bias, penalties, then the
   thinking budget's forced tokens;
3. greedy argmax; for sampled rows temperature, min_p, top-k/top-p, random sample;
4. top-k logprobs + the sampled token's logprob and rank, gathered from (1); rows with
   logprob_token_ids take those ids' logprobs instead of the top-k.
The logits are modified in place, as in vLLM.
"""

from __future__ import annotations

import torch
from torch import nn

from libvllm.engine.sample.logits_processor import apply_logit_bias, apply_min_p, apply_min_tokens
from libvllm.engine.sample.metadata import SamplingMetadata
from libvllm.engine.sample.ops.bad_words import apply_bad_words
from libvllm.engine.sample.ops.logprobs import (
    compute_logprobs,
    gather_logprobs,
    gather_logprobs_with_ids,
)
from libvllm.engine.sample.ops.penalties import apply_all_penalties
from libvllm.engine.sample.ops.thinking_budget import apply_thinking_budget
from libvllm.engine.sample.ops.topk_topp_sampler import (
    apply_top_k_top_p,
    argmax_rows,
    random_sample,
)
from libvllm.engine.sample.outputs import SamplerOutput

_SAMPLING_EPS = 1e-5


class Sampler(nn.Module):
    def forward(self, logits: torch.Tensor, md: SamplingMetadata) -> SamplerOutput:
        # logits: [num_reqs, vocab] -> sampled [num_reqs] int64 (+ logprobs)
        num_logprobs = md.max_num_logprobs
        raw_logprobs = None if num_logprobs is None and md.logprob_token_ids is None \
            else compute_logprobs(logits)
        logits = logits.to(torch.float32)
        logits = self.apply_logits_processors(logits, md)
        sampled = self.sample(logits, md)
        logprobs = None
        if md.logprob_token_ids is not None:
            logprobs = gather_logprobs_with_ids(raw_logprobs, num_logprobs, sampled,
                                                md.logprob_token_ids)
        elif raw_logprobs is not None:
            logprobs = gather_logprobs(raw_logprobs, num_logprobs, sampled)
        return SamplerOutput(sampled, logprobs)

    @staticmethod
    def apply_logits_processors(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        if md.allowed_token_ids_mask is not None:
            logits.masked_fill_(md.allowed_token_ids_mask, -float("inf"))
        if md.bad_words_token_ids:
            apply_bad_words(logits, md.bad_words_token_ids, md.output_token_ids)
        logits = apply_min_tokens(logits, md.min_tokens)
        logits = apply_logit_bias(logits, md.logit_bias)
        if not md.no_penalties:
            logits = apply_all_penalties(logits, md.prompt_token_ids, md.presence_penalties,
                                         md.frequency_penalties, md.repetition_penalties,
                                         md.output_token_ids, md.last_token_ids)
        if md.thinking_budget_targets is not None:  # last, as vLLM's MRV2
            logits = apply_thinking_budget(logits, md.thinking_budget_targets,
                                           md.last_token_ids)
        return logits

    @staticmethod
    def sample(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        greedy = None if md.all_random else argmax_rows(logits)
        if md.all_greedy:
            return greedy
        temp = md.temperature
        if not md.all_random:  # greedy rows divide by 1
            temp = torch.where(temp < _SAMPLING_EPS, 1.0, temp)
        logits = logits.div_(temp.unsqueeze(1))
        if md.min_p is not None:
            logits = apply_min_p(logits, md.min_p)
        logits = apply_top_k_top_p(logits, md.top_k, md.top_p)
        sampled = random_sample(logits, md.generators)  # argmax(softmax / q), no softmax
        if greedy is None:
            return sampled
        return torch.where(md.temperature < _SAMPLING_EPS, greedy, sampled)
