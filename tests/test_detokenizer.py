"""Incremental detokenization and stop strings.

check_stop_strings cases are ported from upstream vLLM 0.33
tests/detokenizer/test_check_stop_strings.py; min_tokens with stop strings from
tests/detokenizer/test_min_tokens.py (the truth recomputed for our tokenizer: the first
stop match that ends past the text of the first min_tokens tokens); detokenize=False
from tests/detokenizer/test_disable_detokenization.py. The streaming checks use the
real default model's tokenizer: concatenated deltas equal the one-shot decode, and no
delta ever carries a broken UTF-8 sequence (U+FFFD), even for multi-token emoji.
spaces_between_special_tokens uses a small WordPiece-decoded tokenizer built here
(byte-level decoders never add spaces, so the default model cannot show it); oracle:
the `tokenizers` one-shot decode, and vLLM FastIncrementalDetokenizer's rule.
"""

from __future__ import annotations

import pytest
from tokenizers import AddedToken, decoders, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import WordLevel

from libvllm.engine.detokenizer import (
    FastIncrementalDetokenizer,
    IncrementalDetokenizer,
    check_stop_strings,
)
from libvllm.engine.gguf.reader import GGUFReader
from libvllm.engine.sampling_params import SamplingParams
from libvllm.engine.tokenizer import Tokenizer


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
    detok = IncrementalDetokenizer.from_new_request(tokenizer.backend, prompt, SamplingParams())
    deltas = []
    for tok in ids:
        detok.update([tok], stop_terminated=False)
        deltas.append(detok.get_next_output_text(finished=False, delta=True))
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == tokenizer.decode(ids) == text


def test_stop_string_truncates_and_holds_back(tokenizer):
    ids = tokenizer.encode("The answer is Paris, France.", add_special_tokens=False)
    detok = IncrementalDetokenizer.from_new_request(tokenizer.backend, [1],
                                                   SamplingParams(stop=["Paris"]))
    streamed, hit = "", None
    for tok in ids:
        hit = detok.update([tok], stop_terminated=False)
        streamed += detok.get_next_output_text(finished=hit is not None, delta=True)
        if hit:
            break
    assert hit == "Paris"
    assert streamed == "The answer is "


MIN_TOKENS_TEXT = "Hello, my name is Lee, and I'm a student in the college of engineering"


@pytest.mark.parametrize(("min_tokens", "stop"), [(0, None), (0, "e"), (5, "e"), (3, "in")])
def test_min_tokens_with_stop(tokenizer, min_tokens, stop):
    ids = tokenizer.encode(MIN_TOKENS_TEXT, add_special_tokens=False)
    prompt, output = ids[:4], ids[4:]
    detok = IncrementalDetokenizer.from_new_request(
        tokenizer.backend, prompt, SamplingParams(stop=stop, min_tokens=min_tokens))
    hit = detok.update(output, False)  # all at once: the check starts past min_tokens
    full = tokenizer.decode(output)
    if stop is None:
        assert hit is None and detok.output_text == full
        return
    skipped = len(tokenizer.decode(output[:min_tokens]))
    truth = full[:full.index(stop, max(skipped - len(stop) + 1, 0))]
    assert hit == stop and detok.output_text == truth


def test_stop_terminated_token_is_tracked_but_not_shown(tokenizer):
    ids = tokenizer.encode("Paris is nice", add_special_tokens=False)
    detok = IncrementalDetokenizer.from_new_request(tokenizer.backend, [1], SamplingParams())
    detok.update(ids, stop_terminated=True)
    assert detok.output_token_ids == ids
    assert detok.output_text == tokenizer.decode(ids[:-1])
    shown = IncrementalDetokenizer.from_new_request(
        tokenizer.backend, [1], SamplingParams(include_stop_str_in_output=True))
    shown.update(ids, stop_terminated=True)
    assert shown.output_text == tokenizer.decode(ids)


def test_detokenize_false_tracks_tokens_only(tokenizer):
    detok = IncrementalDetokenizer.from_new_request(
        tokenizer.backend, [1], SamplingParams(detokenize=False))
    assert type(detok) is IncrementalDetokenizer
    assert detok.update([5, 6], False) is None and detok.output_token_ids == [5, 6]
    assert detok.get_next_output_text(finished=True, delta=False) == ""


@pytest.fixture(scope="module")
def wordpiece():
    tok = HFTokenizer(WordLevel({"hello": 0, "world": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece()
    tok.add_special_tokens([AddedToken("<a>", special=True), AddedToken("<b>", special=True)])
    return tok


@pytest.mark.parametrize(("spaces", "skip", "expected"), [
    (True, False, " <a> <b> world"),  # the one-shot decode's spacing
    (False, False, " <a><b> world"),  # a special right after a special: raw content
    (False, True, " world"),  # skipped specials: the setting is moot
])
def test_spaces_between_special_tokens(wordpiece, spaces, skip, expected):
    ids = wordpiece.encode("hello <a><b> world").ids
    detok = IncrementalDetokenizer.from_new_request(
        wordpiece, ids[:1], SamplingParams(skip_special_tokens=skip,
                                           spaces_between_special_tokens=spaces))
    assert isinstance(detok, FastIncrementalDetokenizer)
    detok.update(ids[1:], False)
    assert detok.output_text == expected
    if spaces and not skip:
        assert wordpiece.decode(ids, skip_special_tokens=False) == "hello" + expected
