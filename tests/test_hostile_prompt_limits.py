"""engine/entrypoints/openai/prompt_limits.py : a prompt text that
provably has more tokens than the context is refused before it is tokenized, with vLLM's
context-length 400 (vllm/renderers/params.py); the bound holds only for normalizers that
never shorten text; long texts are encoded with the GIL released, to the same ids."""

from __future__ import annotations

import threading
import time

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, normalizers

from libvllm.engine.entrypoints.openai.errors import VLLMValidationError
from libvllm.engine.entrypoints.openai.prompt_limits import encode_prompt, longest_token_chars


class _Tok:
    """A tokenizer whose encode must not be reached (or counts its calls)."""

    def __init__(self, normalizer=None) -> None:
        self.backend = HFTokenizer(models.WordLevel({"[UNK]": 0, "hello": 1, "abcdefgh": 2},
                                                    unk_token="[UNK]"))
        if normalizer is not None:
            self.backend.normalizer = normalizer
        self.calls = 0

    def encode(self, text, add_special_tokens=True):
        self.calls += 1
        return [1] * 3


def test_longest_token_and_normalizers():
    assert longest_token_chars(_Tok()) == 8
    assert longest_token_chars(_Tok(normalizers.Replace(" ", "\u2581"))) == 8
    assert longest_token_chars(_Tok(normalizers.NFKC())) is None  # may shorten text
    assert longest_token_chars(_Tok(normalizers.Replace("ab", "c"))) is None


def test_refused_before_tokenizing():
    tok = _Tok()
    with pytest.raises(VLLMValidationError, match="maximum context length is 10 tokens. "
                       "However, your prompt contains at least 11 input tokens") as exc:
        encode_prompt(tok, "x" * 81, 10, add_special_tokens=True, truncating=False)
    assert exc.value.parameter == "input_tokens" and tok.calls == 0
    assert encode_prompt(tok, "x" * 80, 10, add_special_tokens=True, truncating=False) == [1] * 3
    encode_prompt(tok, "x" * 10_000, 10, add_special_tokens=True, truncating=True)  # truncated
    encode_prompt(_Tok(normalizers.NFKC()), "x" * 10_000, 10, add_special_tokens=True,
                  truncating=False)  # no bound: tokenized (the caller's count check refuses)


def test_long_text_encoded_with_the_gil_released(model_path):
    from libvllm.engine.gguf.reader import GGUFReader
    from libvllm.engine.tokenizers.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf_metadata(GGUFReader(model_path).metadata)
    text = "The capital of France is Paris. " * 40_000
    expected = tok.backend.encode(text).ids
    gaps, done = [], threading.Event()

    def tick():
        last = time.monotonic()
        while not done.is_set():
            time.sleep(0.005)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticker = threading.Thread(target=tick)
    ticker.start()
    started = time.monotonic()
    try:
        ids = tok.encode(text)
    finally:
        took = time.monotonic() - started
        done.set()
        ticker.join()
    assert ids == expected
    assert max(gaps) < took / 2  # the GIL held for the whole encode: one gap as long
