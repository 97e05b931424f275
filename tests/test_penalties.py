"""Presence / frequency / repetition penalties of the Sampler.

Mirrors vLLM 0.33 tests/v1/sample/test_sampler.py (test_sampler_presence_penalty,
test_sampler_frequency_penalty, test_sampler_repetition_penalty: flat logits, the
penalized / favoured token must come from the output or prompt as the sign says),
re-expressed for our SamplingMetadata. Plus a direct oracle: apply_penalties against a
per-row, per-token Python computation of the OpenAI / CTRL formulas, and the batch
metadata builder (padding with vocab) against the same oracle.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from libvllm.engine.sample.metadata import SamplingMetadata, build_sampling_metadata
from libvllm.engine.sample.ops.penalties import apply_penalties
from libvllm.engine.sample.ops.torch_utils import make_tensor_with_pad
from libvllm.engine.sample.sampler import Sampler
from libvllm.engine.sampling_params import SamplingParams

VOCAB_SIZE = 1024
NUM_OUTPUT_TOKENS = 20
MAX_NUM_PROMPT_TOKENS = 64


def _fake_logits(batch_size: int) -> torch.Tensor:
    return torch.full((batch_size, VOCAB_SIZE), 1e-2, dtype=torch.float)


def _metadata(batch_size: int, output_token_ids=None, presence=0.0, frequency=0.0,
              repetition=1.0) -> SamplingMetadata:
    rng = np.random.default_rng(batch_size)
    if output_token_ids is None:
        output_token_ids = [rng.integers(0, VOCAB_SIZE, NUM_OUTPUT_TOKENS).tolist()
                            for _ in range(batch_size)]
    prompts = [rng.integers(0, VOCAB_SIZE, rng.integers(1, MAX_NUM_PROMPT_TOKENS)).tolist()
               for _ in range(batch_size)]

    def full(v):
        return torch.full((batch_size,), v, dtype=torch.float)

    return SamplingMetadata(
        temperature=None, all_greedy=True, all_random=False, no_penalties=False,
        prompt_token_ids=make_tensor_with_pad(prompts, VOCAB_SIZE, torch.device("cpu")),
        output_token_ids=output_token_ids, presence_penalties=full(presence),
        frequency_penalties=full(frequency), repetition_penalties=full(repetition))


def _weighted_output_tokens(batch_size: int):
    """Each row's distinct tokens occur 1, 2, 3, ... times (upstream's helper)."""
    rng = np.random.default_rng(0)
    outputs, distinct = [], []
    for _ in range(batch_size):
        ids = rng.choice(VOCAB_SIZE, size=rng.integers(1, 10), replace=False).tolist()
        distinct.append(ids)
        outputs.append([t for i, t in enumerate(ids) for _ in range(i + 1)])
    return outputs, distinct


@pytest.mark.parametrize("batch_size", [1, 2, 32])
@pytest.mark.parametrize("presence_penalty", [-2.0, 2.0])
def test_sampler_presence_penalty(batch_size, presence_penalty):
    md = _metadata(batch_size, presence=presence_penalty)
    logits = Sampler.apply_logits_processors(_fake_logits(batch_size), md)
    for row in range(batch_size):
        favoured, penalized = logits[row].argmax().item(), logits[row].argmin().item()
        out = md.output_token_ids[row]
        if presence_penalty > 0:
            assert penalized in out and favoured not in out
        else:
            assert favoured in out and penalized not in out


@pytest.mark.parametrize("batch_size", [1, 2, 32])
@pytest.mark.parametrize("frequency_penalty", [-2.0, 2.0])
def test_sampler_frequency_penalty(batch_size, frequency_penalty):
    outputs, distinct = _weighted_output_tokens(batch_size)
    md = _metadata(batch_size, output_token_ids=outputs, frequency=frequency_penalty)
    logits = Sampler.apply_logits_processors(_fake_logits(batch_size), md)
    for row in range(batch_size):
        favoured, penalized = logits[row].argmax().item(), logits[row].argmin().item()
        most_frequent = distinct[row][-1]
        if frequency_penalty > 0:
            assert favoured not in distinct[row] and penalized == most_frequent
        else:
            assert favoured == most_frequent and penalized not in distinct[row]


@pytest.mark.parametrize("batch_size", [1, 2, 32])
@pytest.mark.parametrize("repetition_penalty", [0.1, 1.9])
def test_sampler_repetition_penalty(batch_size, repetition_penalty):
    md = _metadata(batch_size, repetition=repetition_penalty)
    logits = Sampler.apply_logits_processors(_fake_logits(batch_size), md)
    for row in range(batch_size):
        favoured, penalized = logits[row].argmax().item(), logits[row].argmin().item()
        seen = set(md.prompt_token_ids[row].tolist()) | set(md.output_token_ids[row])
        if repetition_penalty > 1.0:
            assert favoured not in seen and penalized in seen
        else:
            assert penalized not in seen and favoured in seen


def _reference(logits, prompts, outputs, presence, frequency, repetition):
    out = logits.clone()
    for r in range(out.shape[0]):
        for t in range(out.shape[1]):
            count = outputs[r].count(t)
            if t in prompts[r] or count:
                v = out[r, t].item()
                out[r, t] = v / repetition[r] if v > 0 else v * repetition[r]
            out[r, t] -= frequency[r] * count + presence[r] * (count > 0)
    return out


def test_apply_penalties_matches_the_formulas():
    torch.manual_seed(0)
    vocab = 40
    logits = torch.randn(3, vocab)
    prompts = [[1, 2, 2, 39], [5], [0, 7, 7, 7]]
    outputs = [[2, 3, 3, 3], [], [7, 8]]
    presence, frequency, repetition = [0.5, -1.0, 0.0], [0.3, 2.0, -0.7], [1.3, 0.8, 1.0]
    got = apply_penalties(logits.clone(), make_tensor_with_pad(prompts, vocab, logits.device),
                          make_tensor_with_pad(outputs, vocab, logits.device),
                          torch.tensor(presence), torch.tensor(frequency),
                          torch.tensor(repetition))
    ref = _reference(logits, prompts, outputs, presence, frequency, repetition)
    torch.testing.assert_close(got, ref)


def test_metadata_builder_feeds_penalties_per_row():
    vocab = 40
    torch.manual_seed(1)
    logits = torch.randn(3, vocab)
    sps = [SamplingParams(repetition_penalty=1.5), SamplingParams(),
           SamplingParams(frequency_penalty=1.0, presence_penalty=0.5)]
    token_ids = [[1, 2, 3, 4, 4], [5, 6, 6], [7, 9, 9, 9]]
    num_prompt = [3, 2, 1]
    md = build_sampling_metadata(sps, token_ids, num_prompt, {}, vocab, torch.device("cpu"))
    assert not md.no_penalties
    got = Sampler.apply_logits_processors(logits.clone(), md)
    ref = _reference(logits, [t[:n] for t, n in zip(token_ids, num_prompt)],
                     [t[n:] for t, n in zip(token_ids, num_prompt)],
                     [0.0, 0.0, 0.5], [0.0, 0.0, 1.0], [1.5, 1.0, 1.0])
    torch.testing.assert_close(got, ref)
    plain = build_sampling_metadata([SamplingParams()], [[1, 2]], [1], {}, vocab,
                                    torch.device("cpu"))
    assert plain.no_penalties and plain.prompt_token_ids is None
