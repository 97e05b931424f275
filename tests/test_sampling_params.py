"""SamplingParams: defaults, normalisation and every validation error.

Oracle: vLLM 0.33 vllm/sampling_params.py (defaults, __post_init__, _verify_args,
verify, from_optional, update_from_tokenizer) and its messages; mirrors the cases of
upstream tests/test_sampling_params.py, tests/v1/sample/test_logprobs.py::test_max_logprobs
and tests/v1/sample/test_sampling_params_e2e.py (allowed_token_ids rejections),
re-expressed for our API (verify(vocab_size, max_logprobs) instead of a ModelConfig).
The bad-words cases use the real default model's tokenizer.
"""

from __future__ import annotations

import math

import pytest

from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.gguf.reader import GGUFReader
from libvllm.engine.sampling_params import RequestOutputKind, SamplingParams, SamplingType
from libvllm.engine.tokenizer import Tokenizer

VOCAB = 1024


def test_defaults_are_vllms():
    sp = SamplingParams()
    assert (sp.n, sp.presence_penalty, sp.frequency_penalty, sp.repetition_penalty) == \
        (1, 0.0, 0.0, 1.0)
    assert (sp.temperature, sp.top_p, sp.top_k, sp.min_p, sp.seed) == (1.0, 1.0, 0, 0.0, None)
    assert (sp.stop, sp.stop_token_ids, sp.bad_words) == ([], [], [])
    assert (sp.ignore_eos, sp.max_tokens, sp.min_tokens) == (False, 16, 0)
    assert (sp.logprobs, sp.prompt_logprobs) == (None, None)
    assert (sp.detokenize, sp.skip_special_tokens, sp.spaces_between_special_tokens,
            sp.include_stop_str_in_output) == (True, True, True, False)
    assert sp.output_kind == RequestOutputKind.CUMULATIVE
    assert (sp.logit_bias, sp.allowed_token_ids, sp.skip_reading_prefix_cache) == \
        (None, None, False)
    assert sp.sampling_type == SamplingType.RANDOM


def test_normalisation():
    sp = SamplingParams(temperature=0.001, seed=-1, stop="x", stop_token_ids=[3, 3, 4],
                        bad_words=["a", "a"], logprobs=True, prompt_logprobs=True)
    assert sp.temperature == 0.01 and sp.seed is None
    assert sp.stop == ["x"] and sp.stop_token_ids == [3, 4] and sp.bad_words == ["a"]
    assert sp.logprobs == 1 and sp.prompt_logprobs == 1
    assert sp.skip_reading_prefix_cache is True  # prompt logprobs need the whole prompt
    assert SamplingParams(prompt_logprobs=0, skip_reading_prefix_cache=False
                          ).skip_reading_prefix_cache is True  # ours: even when told not to
    assert sp.all_stop_token_ids == {3, 4}
    assert SamplingParams(stop=["ab", "abcd"]).output_text_buffer_length == 3
    assert SamplingParams(stop=["abcd"], include_stop_str_in_output=True
                          ).output_text_buffer_length == 0
    greedy = SamplingParams(temperature=0.0, top_p=0.5, top_k=3, min_p=0.2)
    assert (greedy.top_p, greedy.top_k, greedy.min_p) == (1.0, 0, 0.0)
    assert greedy.sampling_type == SamplingType.GREEDY
    assert SamplingParams(seed=3).sampling_type == SamplingType.RANDOM_SEED
    assert SamplingParams(output_kind=1).output_kind == RequestOutputKind.DELTA


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"n": 0}, "n must be at least 1, got 0."),
    ({"n": 16385}, "n must be at most 16384, got 16385."),
    ({"n": 1.5}, "n must be an int, but is of type <class 'float'>"),
    ({"n": 2, "temperature": 0.0}, "n must be 1 when using greedy sampling, got 2."),
    ({"presence_penalty": 2.5}, "presence_penalty must be in [-2, 2], got 2.5."),
    ({"presence_penalty": math.nan}, "presence_penalty must be in [-2, 2], got nan."),
    ({"frequency_penalty": -2.1}, "frequency_penalty must be in [-2, 2], got -2.1."),
    ({"repetition_penalty": math.inf}, "repetition_penalty must be a finite number, got inf."),
    ({"repetition_penalty": 0.0}, "repetition_penalty must be greater than zero, got 0.0."),
    ({"temperature": math.nan}, "temperature must be a finite number, got nan."),
    ({"temperature": -0.5}, "temperature must be non-negative, got -0.5."),
    ({"temperature": 2.5}, "temperature must be in [0, 2], got 2.5."),
    ({"top_p": 0.0}, "top_p must be in (0, 1], got 0.0."),
    ({"top_p": 1.5}, "top_p must be in (0, 1], got 1.5."),
    ({"top_k": -2}, "top_k must be 0 (disable), or at least 1, got -2."),
    ({"top_k": 2.0}, "top_k must be an integer, got float"),
    ({"min_p": 1.5}, "min_p must be in [0, 1], got 1.5."),
    ({"seed": 2**64}, "seed must fit in 64 bits"),
    ({"max_tokens": 0}, "max_tokens must be at least 1, got 0."),
    ({"min_tokens": -1}, "min_tokens must be greater than or equal to 0, got -1."),
    ({"min_tokens": 5, "max_tokens": 4},
     "min_tokens must be less than or equal to max_tokens=4, got 5."),
    ({"logprobs": -2}, "logprobs must be non-negative or -1, got -2."),
    ({"prompt_logprobs": -3}, "prompt_logprobs must be non-negative or -1, got -3."),
    ({"stop_token_ids": [1, "a"]}, "stop_token_ids must contain only integers"),
    ({"stop": ["a", ""]}, "stop cannot contain an empty string."),
    ({"stop": ["a"], "detokenize": False},
     "stop strings are only supported when detokenize is True. Set detokenize=True to use stop."),
    ({"bad_words": ["x", ""]}, "bad_words cannot contain an empty string. Got bad_words=['x', '']"),
    ({"temperature": "hot"}, "temperature must be a number, got str"),
    ({"ignore_eos": 1}, "ignore_eos must be a bool, got int"),
    ({"max_tokens": 3.0}, "max_tokens must be an integer, got float"),
    ({"output_kind": 7}, "output_kind must be 0, 1 or 2, got 7"),
    ({"allowed_token_ids": "0,1"}, "allowed_token_ids must contain only integers"),
    ({"logit_bias": [1, 2]}, "logit_bias must be a dict, got list"),
    ({"logit_bias": {"1": 2.0}}, "logit_bias keys must be integer token ids"),
    ({"logit_bias": {1: math.nan}}, "logit_bias values must be finite numbers, got nan"),
])
def test_invalid_params_raise_vllms_message(kwargs, message):
    with pytest.raises(InvalidArgumentError) as e:
        SamplingParams(**kwargs)
    assert message in str(e.value)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"logprobs": 21}, "Requested sample logprobs of 21, which is greater than max allowed: 20"),
    ({"logprobs": -1}, f"Requested sample logprobs of {VOCAB}, which is greater than max "
                       "allowed: 20"),
    ({"prompt_logprobs": 21},
     "Requested prompt logprobs of 21, which is greater than max allowed: 20"),
    ({"logit_bias": {VOCAB: 1.0, -1: 2.0}},
     f"token_id(s) [{VOCAB}, -1] in logit_bias contain out-of-vocab token ids. "
     f"Vocabulary size: {VOCAB}"),
    ({"stop_token_ids": [VOCAB + 5]},
     f"token_id(s) [{VOCAB + 5}] in stop_token_ids contain out-of-vocab token ids."),
    ({"allowed_token_ids": []}, "allowed_token_ids is not None and empty!"),
    ({"allowed_token_ids": [-1]}, "allowed_token_ids contains out-of-vocab token id!"),
    ({"allowed_token_ids": [10000000]}, "allowed_token_ids contains out-of-vocab token id!"),
])
def test_verify_against_the_model(kwargs, message):
    with pytest.raises(InvalidArgumentError) as e:
        SamplingParams(**kwargs).verify(VOCAB, 20)
    assert message in str(e.value)


def test_verify_accepts_in_range_and_whole_vocab_when_unlimited():
    SamplingParams(logprobs=20, prompt_logprobs=0, logit_bias={0: 1.0, VOCAB - 1: -1.0},
                   allowed_token_ids=[0, VOCAB - 1]).verify(VOCAB, 20)
    SamplingParams(logprobs=-1, prompt_logprobs=-1).verify(VOCAB, -1)  # --max-logprobs -1
    SamplingParams(logprobs=1).verify(VOCAB, 1)  # upstream test_max_logprobs: 1 passes
    with pytest.raises(InvalidArgumentError):
        SamplingParams(logprobs=2).verify(VOCAB, 1)  # ... and 2 does not


def test_from_optional_converts_and_clamps_logit_bias():
    sp = SamplingParams.from_optional(logit_bias={"5": 250.0, 7: -1e9, 9: 3}, temperature=None,
                                      n=None, top_p=None)
    assert sp.logit_bias == {5: 100.0, 7: -100.0, 9: 3}
    assert (sp.temperature, sp.n, sp.top_p) == (1.0, 1, 1.0)
    with pytest.raises(InvalidArgumentError) as e:
        SamplingParams.from_optional(logit_bias={"x": 1.0, 2: 1.0})
    assert "logit_bias contains key(s) that cannot be converted to integer token IDs: ['x']" \
        in str(e.value)


def test_engine_side_updates_and_clone():
    sp = SamplingParams(stop_token_ids=[7], ignore_eos=True)
    clone = sp.clone()
    clone.update_from_generation_config({}, eos_token_id=2)
    assert clone.eos_token_id is None  # ignore_eos keeps eos out of the stop check
    assert clone.all_stop_token_ids == {2, 7}  # ... but min_tokens still masks it
    assert sp.all_stop_token_ids == {7}  # the caller's object is untouched


@pytest.mark.parametrize("eos, ignore_eos, want_stop_ids, want_all", [
    ([2, 5, 9], False, {5, 7, 9}, {2, 5, 7, 9}),  # the primary eos stays out of the list
    (5, False, {5, 7}, {2, 5, 7}),  # an int as well as a list
    ([2, 5], True, {7}, {2, 5, 7}),  # ignore_eos: not stops, still masked by min_tokens
    (None, False, {7}, {2, 7}),
])
def test_generation_config_eos_ids_become_stop_ids(eos, ignore_eos, want_stop_ids, want_all):
    """vllm/sampling_params.py update_from_generation_config: generation_config.json's
    eos_token_id (int or list) joins stop_token_ids, all but the tokenizer's eos."""
    sp = SamplingParams(stop_token_ids=[7], ignore_eos=ignore_eos)
    sp.update_from_generation_config({} if eos is None else {"eos_token_id": eos}, 2)
    assert set(sp.stop_token_ids) == want_stop_ids and sp.all_stop_token_ids == want_all
    assert sp.eos_token_id == (None if ignore_eos else 2)


@pytest.fixture(scope="module")
def tokenizer(model_path):
    with GGUFReader(model_path) as r:
        return Tokenizer.from_gguf_metadata(r.metadata)


def test_bad_words_tokenized_with_and_without_leading_space(tokenizer):
    sp = SamplingParams(bad_words=["hello", " Paris France"])
    sp.update_from_tokenizer(tokenizer)
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    expected = []
    for word in ("hello", " Paris France"):
        plain, spaced = enc(word.lstrip()), enc(" " + word.lstrip())
        expected.append(plain)
        if spaced[0] != plain[0] and len(spaced) == len(plain):
            expected.append(spaced)
    assert sp.bad_words_token_ids == expected
    assert [enc(" hello")] == [ids for ids in expected if ids == enc(" hello")]


def test_too_many_bad_words(tokenizer):
    sp = SamplingParams(bad_words=[f"w{i}" for i in range(65)])  # 2 sequences each
    with pytest.raises(InvalidArgumentError) as e:
        sp.update_from_tokenizer(tokenizer)
    assert "Too many bad words after tokenization: 129. The max number is 128." in str(e.value)
