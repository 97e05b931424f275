"""examples/bench/datasets.py: vLLM's random dataset (vllm/benchmarks/datasets/random.py)
as token ids, and the ShareGPT-shaped synthetic lengths. Mirrors the length and prefix
checks of vLLM's tests/benchmarks/test_random_dataset.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

from examples.bench.datasets import (
    is_valid_sequence,
    random_lengths,
    sample_random,
    sample_sharegpt_synthetic,
)

VOCAB = 1000


def test_fixed_lengths_without_range():
    reqs = sample_random(50, VOCAB, input_len=64, output_len=16)
    assert len(reqs) == 50
    assert all(r.prompt_len == len(r.prompt) == 64 for r in reqs)
    assert all(r.expected_output_len == 16 for r in reqs)
    assert [r.request_id for r in reqs] == [str(i) for i in range(50)]
    assert all(0 <= t < VOCAB for r in reqs for t in r.prompt)


@pytest.mark.parametrize("ratio", [0.1, 0.5, 0.9])
def test_lengths_stay_in_the_range_ratio_bounds(ratio):
    reqs = sample_random(400, VOCAB, input_len=100, output_len=20, range_ratio=ratio, seed=3)
    ins = [r.prompt_len for r in reqs]
    outs = [r.expected_output_len for r in reqs]
    assert min(ins) >= math.floor(100 * (1 - ratio)) and max(ins) <= math.ceil(100 * (1 + ratio))
    assert min(outs) >= max(1, math.floor(20 * (1 - ratio)))
    assert max(outs) <= math.ceil(20 * (1 + ratio))
    assert len(set(ins)) > 5  # actually spread out


def test_range_ratio_must_be_below_one():
    with pytest.raises(ValueError, match=r"range_ratio must be in \[0, 1\)"):
        sample_random(2, VOCAB, range_ratio=1.0, prefix_len=5)


def test_bos_counts_as_the_special_token_vllm_subtracts():
    """vLLM samples input_len - num_special_tokens and the tokenizer adds BOS back: the
    engine sees exactly input_len tokens, BOS first."""
    reqs = sample_random(10, VOCAB, input_len=32, output_len=4, bos_token_id=7,
                         special_ids=(7, 8))
    assert all(r.prompt_len == 32 and r.prompt[0] == 7 for r in reqs)
    assert all(t not in (7, 8) for r in reqs for t in r.prompt[1:])


def test_prefix_is_shared_and_the_rest_follows_vllms_sequence():
    reqs = sample_random(8, VOCAB, input_len=40, output_len=4, prefix_len=10, seed=1)
    prefix = reqs[0].prompt[:10]
    assert all(r.prompt[:10] == prefix and r.prompt_len == 50 for r in reqs)
    for r in reqs:  # allowed[(offset + i + arange(n)) % len(allowed)]: consecutive ids
        inner = np.array(r.prompt[10:])
        assert ((np.diff(inner) % VOCAB) == 1).all()


def test_same_seed_same_requests_and_vllms_draw_order():
    a = sample_random(20, VOCAB, input_len=50, output_len=10, range_ratio=0.3, seed=5)
    b = sample_random(20, VOCAB, input_len=50, output_len=10, range_ratio=0.3, seed=5)
    assert [r.prompt for r in a] == [r.prompt for r in b]
    # vLLM's get_sampling_params draws input lengths, output lengths, then offsets
    rng = np.random.default_rng(5)
    ins = rng.integers(35, 65 + 1, size=20)
    outs = rng.integers(7, 13 + 1, size=20)
    offsets = rng.integers(0, VOCAB, size=20)
    got = random_lengths(np.random.default_rng(5), 20, 50, 10, 0.3, 0, VOCAB)
    assert all((x == y).all() for x, y in zip(got, (ins, outs, offsets)))
    assert [r.prompt_len for r in a] == ins.tolist()


def test_too_short_input_is_rejected():
    with pytest.raises(ValueError, match="too small"):
        sample_random(1, VOCAB, input_len=1, bos_token_id=0)


def test_sharegpt_synthetic_passes_vllms_filter_with_its_means():
    reqs = sample_sharegpt_synthetic(3000, VOCAB, seed=0)
    assert all(is_valid_sequence(r.prompt_len, r.expected_output_len) for r in reqs)
    mean_in = np.mean([r.prompt_len for r in reqs])
    mean_out = np.mean([r.expected_output_len for r in reqs])
    assert abs(mean_in - 202) < 20 and abs(mean_out - 179) < 18
    assert max(r.prompt_len for r in reqs) <= 1024


def test_sharegpt_output_len_override_and_bos():
    reqs = sample_sharegpt_synthetic(100, VOCAB, output_len=64, seed=2, bos_token_id=1)
    assert all(r.expected_output_len == 64 and r.prompt[0] == 1 for r in reqs)
    assert all(r.prompt_len == len(r.prompt) >= 4 for r in reqs)


def test_is_valid_sequence_matches_vllm():
    assert is_valid_sequence(4, 4)
    assert not is_valid_sequence(3, 100)
    assert not is_valid_sequence(100, 3)
    assert not is_valid_sequence(1025, 10)
    assert not is_valid_sequence(1024, 1025)
