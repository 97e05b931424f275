"""Benchmark request generators: `random` and a ShareGPT-shaped synthetic set.

Mirrors vllm/benchmarks/datasets/random.py (RandomDataset) and the length filter of
vllm/benchmarks/datasets/sharegpt.py (is_valid_sequence). Prompts are token ids (vLLM's
TokensPrompt), so the decode/re-encode round trip of vLLM's text prompts is not needed:
a prompt has exactly the sampled length. As in vLLM, `num_special` tokens (the BOS the
tokenizer would add, 1 for Llama) are taken off the sampled length and BOS is put in front,
so `--input-len 1024` gives 1024 prompt tokens for a model with a BOS token, as vLLM's.

`sharegpt-synthetic` stands in for ShareGPT_V3_unfiltered_cleaned_split.json, which cannot
be downloaded here: prompt and output lengths are log-normal (sigma 1.3 and 1.0, medians
about 124 and 112), drawn until a pair passes vLLM's ShareGPT filter (prompt and output
>= 4 tokens, prompt <= 1024, prompt + output <= 2048). The parameters are chosen so the
filtered means are 202 in / 179 out, the averages vLLM's v0.6.0 blog reports for its
500-prompt ShareGPT sample; the shape of the real distribution is an assumption.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import numpy as np

SHAREGPT_LOGNORMAL = {"input": (4.91, 1.3), "output": (4.72, 1.0)}  # (mu, sigma)
DATASET_NAMES = ("random", "sharegpt-synthetic")


@dataclass
class SampleRequest:
    prompt: list[int]  # token ids
    prompt_len: int
    expected_output_len: int
    request_id: str


def random_lengths(rng: np.random.Generator, num_requests: int, input_len: int,
                   output_len: int, range_ratio: float, num_special: int, vocab_size: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(input_lens, output_lens, offsets) as RandomDataset.get_sampling_params: uniform
    integers in [floor(L(1-r)), ceil(L(1+r))] (the input's L less num_special), output
    at least 1, offsets uniform in [0, vocab_size)."""
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError("range_ratio must be in [0, 1).")
    real_input_len = max(0, int(input_len) - num_special)
    input_low = math.floor(real_input_len * (1 - range_ratio))
    input_high = math.ceil(real_input_len * (1 + range_ratio))
    output_low = max(math.floor(output_len * (1 - range_ratio)), 1)
    output_high = max(math.ceil(output_len * (1 + range_ratio)), 1)
    input_lens = rng.integers(input_low, input_high + 1, size=num_requests)
    output_lens = rng.integers(output_low, output_high + 1, size=num_requests)
    offsets = rng.integers(0, vocab_size, size=num_requests)
    return input_lens, output_lens, offsets


def sample_random(num_requests: int, vocab_size: int, input_len: int = 1024,
                  output_len: int = 128, range_ratio: float = 0.0, prefix_len: int = 0,
                  seed: int = 0, bos_token_id: int | None = None,
                  special_ids: tuple[int, ...] = ()) -> list[SampleRequest]:
    """vLLM's random dataset as token ids: a shared random prefix of `prefix_len` tokens,
    then allowed[(offset + i + arange(n)) % len(allowed)], BOS first when there is one."""
    rng = np.random.default_rng(seed)
    num_special = 0 if bos_token_id is None else 1
    if prefix_len + math.floor(max(0, input_len - num_special) * (1 - range_ratio)) < 1:
        raise ValueError("--random-input-len is too small: the minimum possible total input "
                         "tokens (prefix + sampled) is 0")
    input_lens, output_lens, offsets = random_lengths(
        rng, num_requests, input_len, output_len, range_ratio, num_special, vocab_size)
    allowed = np.setdiff1d(np.arange(vocab_size), np.asarray(special_ids, dtype=np.int64))
    prefix = allowed[rng.integers(0, len(allowed), size=prefix_len)].tolist() \
        if prefix_len > 0 else []
    head = [] if bos_token_id is None else [bos_token_id]
    requests = []
    for i in range(num_requests):
        inner = allowed[(int(offsets[i]) + i + np.arange(int(input_lens[i]))) % len(allowed)]
        ids = head + prefix + inner.tolist()
        requests.append(SampleRequest(ids, len(ids), int(output_lens[i]), str(i)))
    return requests


def is_valid_sequence(prompt_len: int, output_len: int, min_len: int = 4,
                      max_prompt_len: int = 1024, max_total_len: int = 2048) -> bool:
    """vllm/benchmarks/datasets/sharegpt.py::is_valid_sequence (defaults as vLLM's)."""
    return not (prompt_len < min_len or output_len < min_len
                or prompt_len > max_prompt_len or prompt_len + output_len > max_total_len)


def sample_sharegpt_synthetic(num_requests: int, vocab_size: int, output_len: int | None = None,
                              seed: int = 0, bos_token_id: int | None = None,
                              special_ids: tuple[int, ...] = ()) -> list[SampleRequest]:
    """ShareGPT-shaped lengths (module docstring) with random token ids; `output_len`
    overrides every output length, as vLLM's --sharegpt-output-len."""
    rng = np.random.default_rng(seed)
    allowed = np.setdiff1d(np.arange(vocab_size), np.asarray(special_ids, dtype=np.int64))
    head = [] if bos_token_id is None else [bos_token_id]
    (mu_in, sd_in), (mu_out, sd_out) = SHAREGPT_LOGNORMAL["input"], SHAREGPT_LOGNORMAL["output"]
    requests: list[SampleRequest] = []
    while len(requests) < num_requests:
        n_in = int(round(rng.lognormal(mu_in, sd_in)))
        n_out = int(round(rng.lognormal(mu_out, sd_out)))
        if not is_valid_sequence(n_in, n_out if output_len is None else output_len):
            continue
        ids = head + allowed[rng.integers(0, len(allowed), size=n_in - len(head))].tolist()
        requests.append(SampleRequest(ids, len(ids), n_out if output_len is None else output_len,
                                      str(len(requests))))
    return requests


def add_dataset_args(parser: argparse.ArgumentParser, default_name: str = "random") -> None:
    """vLLM's dataset flags (vllm/benchmarks/datasets/arg_utils.py), the random subset;
    the caller adds --seed (an engine flag offline, a benchmark flag for serve)."""
    parser.add_argument("--dataset-name", choices=DATASET_NAMES, default=default_name)
    parser.add_argument("--num-prompts", type=int, default=1000,
                        help="Number of prompts to process.")
    parser.add_argument("--random-input-len", type=int, default=1024)
    parser.add_argument("--random-output-len", type=int, default=128)
    parser.add_argument("--random-range-ratio", type=float, default=0.0)
    parser.add_argument("--random-prefix-len", type=int, default=0)
    parser.add_argument("--input-len", type=int, default=None,
                        help="General input length; maps to --random-input-len.")
    parser.add_argument("--output-len", type=int, default=None,
                        help="General output length; maps to --random-output-len and "
                             "overrides the ShareGPT output lengths.")
    parser.add_argument("--prefix-len", type=int, default=None,
                        help="Maps to --random-prefix-len.")


def get_samples(args: argparse.Namespace, vocab_size: int, bos_token_id: int | None,
                special_ids: tuple[int, ...] = ()) -> list[SampleRequest]:
    if args.dataset_name == "sharegpt-synthetic":
        return sample_sharegpt_synthetic(args.num_prompts, vocab_size, args.output_len,
                                         args.seed, bos_token_id, special_ids)
    return sample_random(
        args.num_prompts, vocab_size,
        args.input_len if args.input_len is not None else args.random_input_len,
        args.output_len if args.output_len is not None else args.random_output_len,
        args.random_range_ratio,
        args.prefix_len if args.prefix_len is not None else args.random_prefix_len,
        args.seed, bos_token_id, special_ids)
