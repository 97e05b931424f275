"""Incremental detokenization and stop strings.

check_stop_strings cases are ported from upstream vLLM 0.33
tests/detokenizer/test_check_stop_strings.py. The streaming checks use the real
default model's tokenizer: concatenated deltas equal the one-shot decode, and no
delta ever carries a broken UTF-8 sequence (U+FFFD), even for multi-token emoji.
"""

from __future__ import annotations

import pytest

from engine.detokenizer import IncrementalDetokenizer, check_stop_strings
from engine.gguf.reader import GGUFReader
from engine.sampling_params import SamplingParams
from engine.tokenizer import Tokenizer


@pytest.mark.parametrize("stop", [["a", "is"], ["is", "a"]])
def test_earliest_completing_stop_wins_regardless_of_list_order(stop):
    assert check_stop_strings(" The user is a", len(" is a"), stop, False) == ("is", 10)
    assert check_stop_strings(" The user is a", len(" is a"), stop, True) == ("is", 12)


def test_completion_position_not_start_position():
    assert check_stop_strings("abc", 3, ["abc", "b"], False) == ("b", 1)


@pytest.mark.parametrize("stop,expected", [(["ab", "b"], ("ab", 0)), (["b", "ab"], ("b", 1))])
def test_ties_broken_by_list_order(stop, expected):
    assert check_stop_strings("ab", 2, stop, False) == expected


def test_single_stop_and_no_match():
    assert check_stop_strings("hello world.", 1, ["."], False) == (".", 11)
    assert check_stop_strings("hello world.", 1, ["."], True) == (".", -1)
    assert check_stop_strings("hello", 5, ["zzz"], False) is None
    assert check_stop_strings("hello", 0, ["h"], False) is None
    assert check_stop_strings("hello", 5, [], False) is None


@pytest.fixture(scope="module")
def tokenizer(model_path):
    with GGUFReader(model_path) as r:
        return Tokenizer.from_gguf_metadata(r.metadata)


TEXTS = [
    "Hello, world! 👋🏽 Família 👨‍👩‍👧 日本語のテキスト",
    "naïve café — ½ ∑ 🚀🚀",
    "plain ascii",
]


@pytest.mark.parametrize("text", TEXTS)
def test_streamed_deltas_are_whole_characters(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    prompt = tokenizer.encode("Say:", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer.backend, prompt, SamplingParams())
    deltas = []
    for tok in ids:
        detok.update([tok], stop_terminated=False)
        deltas.append(detok.get_next_output_text(finished=False, delta=True))
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == tokenizer.decode(ids) == text


def test_stop_string_truncates_and_holds_back(tokenizer):
    ids = tokenizer.encode("The answer is Paris, France.", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer.backend, [1], SamplingParams(stop=["Paris"]))
    streamed, hit = "", None
    for tok in ids:
        hit = detok.update([tok], stop_terminated=False)
        streamed += detok.get_next_output_text(finished=hit is not None, delta=True)
        if hit:
            break
    assert hit == "Paris"
    assert streamed == "The answer is "
