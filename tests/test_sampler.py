"""Sampler units: masking semantics, logits processors and seeded reproducibility.

Mirrors upstream vLLM 0.33 tests/v1/sample/test_topk_topp_sampler.py (top-k/top-p
masks against a direct computation) and tests/v1/sample/test_sampler.py
(test_sampler_allowed_token_ids, test_sampler_bad_words with random multi-token bad
words, min_tokens blocks stop tokens, greedy rows inside a random batch), plus the
builtin logits processors of vllm/v1/sample/logits_processor/builtin.py (min_p,
logit_bias), re-expressed for our Sampler. The penalties are in test_penalties.py,
logprobs in test_logprobs.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from libvllm.engine.sample.logits_processor import apply_logit_bias, apply_min_p
from libvllm.engine.sample.metadata import SamplingMetadata, build_sampling_metadata
from libvllm.engine.sample.ops.topk_topp_sampler import apply_top_k_top_p
from libvllm.engine.sample.sampler import Sampler
from libvllm.engine.sampling_params import SamplingParams

VOCAB = 64
VOCAB_SIZE = 1024  # the upstream-ported cases
NUM_OUTPUT_TOKENS = 20
CPU = torch.device("cpu")


def _md(n, temp=None, top_k=None, top_p=None, min_p=None, generators=None, min_tokens=None):
    t = None if temp is None else torch.tensor(temp, dtype=torch.float32)
    return SamplingMetadata(
        temperature=t, all_greedy=temp is None, all_random=temp is not None and min(temp) > 0,
        top_p=None if top_p is None else torch.tensor(top_p),
        top_k=None if top_k is None else torch.tensor(top_k),
        min_p=None if min_p is None else torch.tensor(min_p),
        generators=generators or {}, min_tokens=min_tokens or {})


def _sample(logits, md):
    return Sampler()(logits.clone(), md).sampled_token_ids


def test_top_k_keeps_exactly_k_largest():
    logits = torch.randn(3, VOCAB)
    out = apply_top_k_top_p(logits.clone(), torch.tensor([1, 5, VOCAB]), None)
    for row, k in enumerate([1, 5, VOCAB]):
        kept = torch.isfinite(out[row]).nonzero().flatten()
        assert set(kept.tolist()) == set(logits[row].topk(k).indices.tolist())


def test_top_p_keeps_smallest_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    out = apply_top_k_top_p(logits.clone(), None, torch.tensor([0.7]))
    assert torch.isfinite(out[0]).tolist() == [True, True, False, False]
    out = apply_top_k_top_p(logits.clone(), None, torch.tensor([0.01]))
    assert torch.isfinite(out[0]).tolist() == [True, False, False, False]


def test_min_p_masks_relative_to_max():
    logits = torch.log(torch.tensor([[0.6, 0.3, 0.07, 0.03]]))
    out = apply_min_p(logits, torch.tensor([0.1]))
    assert torch.isfinite(out[0]).tolist() == [True, True, True, False]


def test_min_p_only_affects_sampled_rows():
    # a greedy row keeps its argmax whatever min_p; a sampled row with min_p=1 must
    # take the top token (only it reaches 1.0 * max prob)
    logits = torch.randn(2, VOCAB)
    out = _sample(logits, _md(2, temp=[0.0, 1.0], min_p=[1.0, 1.0]))
    assert out.tolist() == logits.argmax(-1).tolist()


def test_greedy_rows_in_random_batch_take_argmax():
    logits = torch.randn(4, VOCAB)
    out = _sample(logits, _md(4, temp=[0.0, 1.0, 0.0, 1.0]))
    assert out[0] == logits[0].argmax() and out[2] == logits[2].argmax()


def test_seeded_rows_reproduce_whatever_the_batch():
    logits = torch.randn(1, VOCAB)

    def gen():
        return torch.Generator().manual_seed(7)
    alone = [_sample(logits, _md(1, temp=[1.0], generators={0: g})).item()
             for g in [gen()] for _ in range(5)]
    g = gen()
    batch = torch.cat([torch.randn(2, VOCAB), logits])
    mixed = [_sample(batch, _md(3, temp=[1.0, 0.5, 1.0], generators={2: g}))[2].item()
             for _ in range(5)]
    assert mixed == alone


def test_min_tokens_blocks_stop_ids():
    logits = torch.zeros(2, VOCAB)
    logits[:, 3] = 10.0  # the stop token dominates
    out = _sample(logits, _md(2, min_tokens={0: {3}}))
    assert out[0] != 3 and out[1] == 3


def test_min_tokens_from_params_until_reached():
    # upstream MinTokensLogitsProcessor: stop ids (and eos) masked while output < min_tokens
    sp = SamplingParams(min_tokens=2, stop_token_ids=[5])
    sp.update_from_generation_config({}, eos_token_id=3)
    md = build_sampling_metadata([sp, sp], [[1, 9], [1, 9, 9, 9]], [1, 1], {}, VOCAB, CPU)
    assert md.min_tokens == {0: {3, 5}}  # row 1 already has 3 output tokens


def test_logit_bias_moves_the_argmax_per_row():
    logits = torch.zeros(3, VOCAB)
    logits[:, 0] = 5.0
    md = build_sampling_metadata(
        [SamplingParams(temperature=0.0, logit_bias={7: 10.0}), SamplingParams(temperature=0.0),
         SamplingParams(temperature=0.0, logit_bias={0: -100.0, 9: 0.5})],
        [[1], [1], [1]], [1, 1, 1], {}, VOCAB, CPU)
    assert _sample(logits, md).tolist() == [7, 0, 9]
    biased = apply_logit_bias(torch.zeros(1, 4), {0: {1: 2.0, 3: -1.0}})
    assert biased.tolist() == [[0.0, 2.0, 0.0, -1.0]]


def _allowed_mask(batch_size, num_allowed):
    """Upstream's create_allowed_token_ids: even rows allow [i, i + num_allowed)."""
    mask = None
    for i in range(0, batch_size, 2):
        if mask is None:
            mask = torch.zeros((batch_size, VOCAB_SIZE), dtype=torch.bool)
        mask[i, min(i, VOCAB_SIZE - 1):min(i + num_allowed, VOCAB_SIZE - 1)] = True
    return mask


@pytest.mark.parametrize("batch_size", [1, 2, 32])
@pytest.mark.parametrize("num_allowed_token_ids", [0, 1, 2])
def test_sampler_allowed_token_ids(batch_size, num_allowed_token_ids):
    md = SamplingMetadata(temperature=None, all_greedy=True, all_random=False,
                          allowed_token_ids_mask=_allowed_mask(batch_size, num_allowed_token_ids))
    logits = Sampler.apply_logits_processors(
        torch.full((batch_size, VOCAB_SIZE), 1e-2), md)
    for row in range(batch_size):
        if row % 2 == 1:
            assert torch.all(logits[row] != -float("inf"))
            continue
        lo, hi = min(row, VOCAB_SIZE - 1), min(row + num_allowed_token_ids, VOCAB_SIZE - 1)
        banned = (logits[row] == -float("inf")).nonzero().flatten().tolist()
        assert banned == list(range(lo, hi))


def test_allowed_token_ids_from_params_force_the_token():
    logits = torch.randn(2, VOCAB)
    md = build_sampling_metadata(
        [SamplingParams(allowed_token_ids=[11]), SamplingParams(allowed_token_ids=[3, 4])],
        [[1], [1]], [1, 1], {}, VOCAB, CPU)
    out = _sample(logits, md)
    assert out[0] == 11 and out[1] in (3, 4)
    assert md.allowed_token_ids_mask.sum(-1).tolist() == [VOCAB - 1, VOCAB - 2]


def _bad_words(batch_size, lengths, rng):
    words = {i: [rng.choice(VOCAB_SIZE, size=n, replace=True).tolist() for n in lengths]
             for i in range(batch_size)}
    if batch_size >= 2:
        words.pop(int(rng.choice(batch_size)))  # some row without bad words
    return words


def _plant_prefixes(words, outputs, rng):
    """Upstream's _update_output_token_ids_for_bad_words: maybe end a row's output with
    one word's prefix; return the tokens each row must then have banned."""
    banned = {}
    for row, row_words in words.items():
        out, expect = outputs[row], []
        for word in row_words:
            if len(word) == 1:
                expect.append(word[0])
            elif rng.choice([True, False]):
                out[-(len(word) - 1):] = word[:-1]
                expect.extend(w[-1] for w in row_words if w[:-1] == word[:-1])
                break
            else:  # make sure no accidental match
                starts = {w[0] for w in row_words}
                out[-1] = int(rng.choice(sorted(set(range(VOCAB_SIZE)) - starts)))
        banned[row] = expect
    return banned


@pytest.mark.parametrize("batch_size", [1, 2, 32])
@pytest.mark.parametrize("bad_words_lengths", [(1,), (1, 3), (2, 2)])
def test_sampler_bad_words(batch_size, bad_words_lengths):
    rng = np.random.default_rng(batch_size * 10 + len(bad_words_lengths))
    outputs = [rng.integers(0, VOCAB_SIZE, NUM_OUTPUT_TOKENS).tolist()
               for _ in range(batch_size)]
    words = _bad_words(batch_size, bad_words_lengths, rng)
    banned = _plant_prefixes(words, outputs, rng)
    md = SamplingMetadata(temperature=None, all_greedy=True, all_random=False,
                          output_token_ids=outputs, bad_words_token_ids=words)
    logits = Sampler.apply_logits_processors(torch.full((batch_size, VOCAB_SIZE), 1e-2), md)
    for row in range(batch_size):
        got = set((logits[row] == -float("inf")).nonzero().flatten().tolist())
        assert got == set(banned.get(row, []))


def test_bad_word_longer_than_output_is_not_applied():
    md = SamplingMetadata(temperature=None, all_greedy=True, all_random=False,
                          output_token_ids=[[4]], bad_words_token_ids={0: [[1, 2, 3]]})
    logits = Sampler.apply_logits_processors(torch.zeros(1, 8), md)
    assert torch.isfinite(logits).all()
