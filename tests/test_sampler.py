"""Sampler units: masking semantics and seeded reproducibility.

Mirrors upstream vLLM 0.33 tests/v1/sample/test_topk_topp_sampler.py (top-k/top-p
masks against a direct computation) and tests/v1/sample/test_sampler.py (min_tokens
blocks stop tokens, greedy rows inside a random batch), re-expressed for our Sampler.
"""

from __future__ import annotations

import torch

from engine.sample.metadata import SamplingMetadata
from engine.sample.sampler import Sampler, apply_min_p, apply_top_k_top_p

VOCAB = 64


def _md(n, temp=None, top_k=None, top_p=None, min_p=None, generators=None, blocked=None):
    t = None if temp is None else torch.tensor(temp, dtype=torch.float32)
    return SamplingMetadata(
        temperature=t, all_greedy=temp is None, all_random=temp is not None and min(temp) > 0,
        top_p=None if top_p is None else torch.tensor(top_p),
        top_k=None if top_k is None else torch.tensor(top_k),
        min_p=None if min_p is None else torch.tensor(min_p),
        generators=generators or {}, min_tokens_blocked=blocked or {})


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


def test_greedy_rows_in_random_batch_take_argmax():
    logits = torch.randn(4, VOCAB)
    out = Sampler()(logits, _md(4, temp=[0.0, 1.0, 0.0, 1.0]))
    assert out[0] == logits[0].argmax() and out[2] == logits[2].argmax()


def test_seeded_rows_reproduce_whatever_the_batch():
    logits = torch.randn(1, VOCAB)

    def gen():
        return torch.Generator().manual_seed(7)
    alone = [Sampler()(logits, _md(1, temp=[1.0], generators={0: g})).item()
             for g in [gen()] for _ in range(5)]
    g = gen()
    batch = torch.cat([torch.randn(2, VOCAB), logits])
    mixed = [Sampler()(batch, _md(3, temp=[1.0, 0.5, 1.0], generators={2: g}))[2].item()
             for _ in range(5)]
    assert mixed == alone


def test_min_tokens_blocks_stop_ids():
    logits = torch.zeros(2, VOCAB)
    logits[:, 3] = 10.0  # the stop token dominates
    out = Sampler()(logits, _md(2, blocked={0: {3}}))
    assert out[0] != 3 and out[1] == 3
