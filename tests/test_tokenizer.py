"""engine.tokenizers: a Tokenizer built from GGUF byte-level BPE (gpt2) tokenizer metadata.

Oracles: (a) transformers' own GGUF tokenizer (`AutoTokenizer.from_pretrained(dir,
gguf_file=...)`) on the real SmolLM2-135M model (VLLM_TEST_MODEL or ~/.cache/libvllm/models/):
ids for a corpus of special tokens, whitespace runs, digits, non-ASCII, emoji, code, and the
decoded text of those ids. Where transformers does not isolate digits for pre "smollm" (llama.cpp
and the original tokenizer.json do), the reference is transformers' ids for the digit-free
fragments, which is what isolating digits means. (b) hand-built metadata for the BOS/EOS rules,
added tokens and every malformed-metadata error.
"""

import logging
import re
import unicodedata

import pytest
from tokenizers.decoders import DecodeStream

from libvllm.engine.errors import InvalidArgumentError, ModelLoadError, UnsupportedError
from libvllm.engine.tokenizer import Tokenizer

CORPUS = [
    "",
    " ",
    "Hello world",
    " Hello world",
    "   leading spaces",
    "trailing spaces   ",
    "tabs\tand\t\ttabs",
    "mixed \t \n\t\n  whitespace\n\n\n",
    "\n\nnewlines first",
    "\r\nwindows\r\nlines",
    "Numbers: 0 1 12 123 1234 12345 3.14159 1e10 2,000,000",
    "x  1 and y\n\n2 and z \t 3",
    "Accents: café naïve résumé Ångström façade",
    "CJK: 你好，世界。日本語のテキスト。한국어 텍스트",
    "Arabic: مرحبا بالعالم",
    "Emoji: 😀 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️",
    "def f(x):\n    return x**2  # square\n\tif x != 0: pass",
    'for (int i = 0; i < n; ++i) { printf("%d\\n", i); }',
    "Contractions: I'm, you're, it's, we've, they'll, I'd, don't, CAN'T",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "text<|endoftext|>more text <|im_end|>",
    "<|im_start|><|im_start|>",
    "unicode ½ ² ① digits",
    "URL: https://example.com/path?q=1&r=2#frag",
]


@pytest.fixture(scope="module")
def metadata(model_path):
    from libvllm.engine.gguf.reader import GGUFReader

    return GGUFReader(model_path).metadata


@pytest.fixture(scope="module")
def tok(metadata):
    return Tokenizer.from_gguf_metadata(metadata)


@pytest.fixture(scope="module")
def hf(hf_test_tokenizer):
    return hf_test_tokenizer


def is_numeric(char: str) -> bool:
    return unicodedata.category(char).startswith("N")  # \p{N}


def digits_isolated_ids(hf, text: str) -> list[int]:
    """transformers' ids with every \\p{N} character split off first (llama.cpp's "smollm"
    pre). No special token of this vocab holds a digit, so none is cut."""
    parts = re.split(r"(.)", text, flags=re.S)  # every character, then regroup
    fragments, current = [], ""
    for char in (p for p in parts if p):
        if is_numeric(char):
            fragments += [current, char]
            current = ""
        else:
            current += char
    return [
        i for f in [*fragments, current] if f for i in hf(f, add_special_tokens=False)["input_ids"]
    ]


# --- (a) the real model against transformers -----------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_encode_matches_transformers(tok, hf, add_special_tokens):
    assert hf("a", add_special_tokens=True)["input_ids"] == hf.encode("a", add_special_tokens=False)
    for text in CORPUS:
        ids = tok.encode(text, add_special_tokens=add_special_tokens)
        assert ids == digits_isolated_ids(hf, text), text
        if not any(map(is_numeric, text)):
            assert ids == hf(text, add_special_tokens=add_special_tokens)["input_ids"], text


@pytest.mark.slow
def test_digit_isolation_is_the_only_difference(tok, hf):
    diverging = [t for t in CORPUS if tok.encode(t) != hf(t)["input_ids"]]
    assert diverging  # the corpus exercises it
    for text in diverging:  # a space before a digit: transformers joins them, llama.cpp doesn't
        assert any(a.isspace() and is_numeric(b) for a, b in zip(text, text[1:])), text
    assert tok.encode("x  1") == [tok.backend.token_to_id(p) for p in ("x", "ĠĠ", "1")]


@pytest.mark.slow
@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_decode_matches_transformers(tok, hf, skip_special_tokens):
    for text in CORPUS:
        for ids in (tok.encode(text), hf(text)["input_ids"]):
            expected = hf.decode(ids, skip_special_tokens=skip_special_tokens)
            assert tok.decode(ids, skip_special_tokens=skip_special_tokens) == expected, text
        if not skip_special_tokens:
            assert tok.decode(tok.encode(text), skip_special_tokens=False) == text


@pytest.mark.slow
def test_special_ids_match_transformers(tok, hf):
    assert (tok.bos_token, tok.eos_token) == (hf.bos_token, hf.eos_token)
    assert (tok.bos_token_id, tok.eos_token_id) == (hf.bos_token_id, hf.eos_token_id)
    assert set(hf.all_special_ids) <= set(tok.all_special_ids)
    assert tok.vocab_size == len(hf) == hf.backend_tokenizer.get_vocab_size()


def test_real_model_fields(tok, metadata):
    assert tok.vocab_size == 49152
    assert (tok.bos_token_id, tok.eos_token_id, tok.unk_token_id, tok.pad_token_id) == (1, 2, 0, 2)
    assert (tok.bos_token, tok.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert tok.all_special_ids == list(range(17))  # the 17 control tokens
    assert tok.chat_template == metadata["tokenizer.chat_template"]
    assert tok.id_to_piece(216) == "Ġ" and tok.id_to_piece(1) == "<|im_start|>"
    # add_bos_token is False: nothing is added
    assert tok.encode("Hello", add_special_tokens=True) == tok.encode("Hello", False) == [19556]
    assert tok.encode("Hello world! 123") == [19556, 905, 17, 216, 33, 34, 35]


def test_decode_stream_on_backend(tok):
    text = "Emoji 👨‍👩‍👧 and 你好 <|im_end|>"
    stream = DecodeStream(skip_special_tokens=False)
    pieces = [stream.step(tok.backend, i) for i in tok.encode(text)]
    assert "".join(p for p in pieces if p) == text


def test_decode_rejects_bad_ids(tok):
    for bad in ([49152], [-1], [1, 10**9], ["1"], [1.0], [True]):
        with pytest.raises(InvalidArgumentError):
            tok.decode(bad)
    with pytest.raises(InvalidArgumentError):
        tok.id_to_piece(49152)
    with pytest.raises(InvalidArgumentError):
        tok.encode(b"bytes")


# --- (b) hand-built metadata ---------------------------------------------------------------


def byte_alphabet() -> list[str]:
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    extra = [b for b in range(256) if b not in keep]
    return [chr(b) for b in keep] + [chr(256 + i) for i in range(len(extra))]


def tiny_metadata(**overrides) -> dict:
    """<|endoftext|>, <s>, </s> (control), <think> (user-defined), the bytes, then merges."""
    tokens = ["<|endoftext|>", "<s>", "</s>", "<think>", *byte_alphabet(), "Ġt", "he", "Ġthe"]
    md = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3, 3, 3, 4] + [1] * (len(tokens) - 4),
        "tokenizer.ggml.merges": ["Ġ t", "h e", "Ġt he"],
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.add_bos_token": False,
    }
    md.update(overrides)
    return {k: v for k, v in md.items() if v is not None}


def test_tiny_vocab_encode_decode():
    tok = Tokenizer.from_gguf_metadata(tiny_metadata())
    the = tok.vocab_size - 1
    assert tok.encode("a the") == [tok.backend.token_to_id("a"), the]
    assert tok.encode("<s><think></s>x") == [1, 3, 2, tok.backend.token_to_id("x")]
    assert tok.decode([1, 3, the, 2]) == "<think> the"  # user-defined tokens are not special
    assert tok.decode([1, 3, the, 2], skip_special_tokens=False) == "<s><think> the</s>"
    assert tok.all_special_ids == [0, 1, 2]
    assert tok.chat_template is None


@pytest.mark.parametrize(
    "add_bos, add_eos, expected",
    [(False, False, [5]), (True, False, [1, 5]), (False, True, [5, 2]), (True, True, [1, 5, 2])],
)
def test_bos_eos_follow_metadata(add_bos, add_eos, expected):
    md = tiny_metadata(
        **{"tokenizer.ggml.add_bos_token": add_bos, "tokenizer.ggml.add_eos_token": add_eos}
    )
    tok = Tokenizer.from_gguf_metadata(md)
    a = tok.backend.token_to_id("a")
    assert tok.encode("a") == [a if i == 5 else i for i in expected]
    assert tok.encode("a", add_special_tokens=False) == [a]


def test_llama3_pre_adds_bos_when_unsaid():
    md = tiny_metadata(**{"tokenizer.ggml.pre": "llama-bpe", "tokenizer.ggml.add_bos_token": None})
    assert Tokenizer.from_gguf_metadata(md).encode("a")[0] == 1
    md["tokenizer.ggml.pre"] = "gpt-2"
    assert Tokenizer.from_gguf_metadata(md).encode("a")[0] != 1


def test_unknown_pre_falls_back_to_gpt2_with_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="libvllm.engine.tokenizers.gguf_bpe"):
        tok = Tokenizer.from_gguf_metadata(tiny_metadata(**{"tokenizer.ggml.pre": "martian"}))
    assert "martian" in caplog.text
    ref = Tokenizer.from_gguf_metadata(tiny_metadata())
    assert tok.encode("a the 12  3") == ref.encode("a the 12  3")


def test_unsupported_tokenizer_models():
    with pytest.raises(UnsupportedError, match="'bert'.*'gpt2'.*'llama'"):
        Tokenizer.from_gguf_metadata(tiny_metadata(**{"tokenizer.ggml.model": "bert"}))


def _n(md) -> int:
    return len(md["tokenizer.ggml.tokens"])


MALFORMED = {
    "no model": {"tokenizer.ggml.model": None},
    "model not a string": {"tokenizer.ggml.model": 2},
    "no tokens": {"tokenizer.ggml.tokens": None},
    "empty tokens": {"tokenizer.ggml.tokens": []},
    "tokens not strings": {"tokenizer.ggml.tokens": [1, 2, 3]},
    "token_type too short": {"tokenizer.ggml.token_type": [1, 1]},
    "token_type not ints": {"tokenizer.ggml.token_type": "3"},
    "no merges": {"tokenizer.ggml.merges": None},
    "merge without space": {"tokenizer.ggml.merges": ["Ġt"]},
    "merge out of vocab": {"tokenizer.ggml.merges": ["q zz"]},
    "bos out of range": {"tokenizer.ggml.bos_token_id": 10**6},
    "eos negative": {"tokenizer.ggml.eos_token_id": -1},
    "bos not an int": {"tokenizer.ggml.bos_token_id": "1"},
    "add_bos not a bool": {"tokenizer.ggml.add_bos_token": 1},
    "add_bos without bos": {
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.bos_token_id": None,
    },
    "chat_template not a string": {"tokenizer.chat_template": ["x"]},
}


@pytest.mark.parametrize("name", MALFORMED)
def test_malformed_metadata(name):
    with pytest.raises(ModelLoadError):
        Tokenizer.from_gguf_metadata(tiny_metadata(**MALFORMED[name]))


def test_duplicate_tokens_rejected():
    md = tiny_metadata()
    tokens = list(md["tokenizer.ggml.tokens"])
    tokens[-1] = tokens[-2]
    md["tokenizer.ggml.tokens"] = tokens
    md["tokenizer.ggml.merges"] = ["Ġ t", "h e"]
    with pytest.raises(ModelLoadError, match="duplicate"):
        Tokenizer.from_gguf_metadata(md)


def test_template_syntax_in_bos_eos_text():
    """BOS/EOS texts that read as TemplateProcessing syntax ("$A", "a:b") are still added."""
    md = tiny_metadata(
        **{"tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_eos_token": True}
    )
    tokens = list(md["tokenizer.ggml.tokens"])
    tokens[1], tokens[2] = "$A", "a:b"
    md["tokenizer.ggml.tokens"] = tokens
    tok = Tokenizer.from_gguf_metadata(md)
    assert tok.encode("x") == [1, tok.backend.token_to_id("x"), 2]
    assert (tok.bos_token, tok.eos_token) == ("$A", "a:b")


def test_id_to_bytes_round_trips_text(tok):
    """llama_token_to_piece: the pieces' bytes concatenate to the UTF-8 text, even where one
    character spans tokens."""
    for text in CORPUS:
        ids = tok.encode(text, add_special_tokens=False)
        assert b"".join(tok.id_to_bytes(i) for i in ids) == text.encode(), text
    assert tok.id_to_bytes(216) == b" " and tok.id_to_bytes(1) == b"<|im_start|>"
