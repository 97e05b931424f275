"""engine.tokenizers (gguf_spm): SentencePiece ('llama') vocabularies from GGUF metadata.

Oracles: (a) transformers' GGUF tokenizer (`AutoTokenizer.from_pretrained(dir, gguf_file=...)`,
what vLLM runs for a GGUF) on the same file: ids with and without special tokens, decoded text
with and without skipping specials, BOS/EOS/special ids; for the real Gemma 3 270M model
(~/.cache/libvllm/models/, skipped when absent) and for small GGUFs written here with
gguf.GGUFWriter from a sentencepiece BPE model trained in the test (llama- and Gemma-shaped);
(b) that sentencepiece model itself (`SentencePieceProcessor.encode`) on text without control
tokens, including add_space_prefix = false, which transformers ignores; (c) hand-edited
metadata for every malformed-key error. No vLLM test covers GGUF tokenizers; the corpus follows
tests/tokenizers_/test_detokenize.py (whitespace, non-ASCII, emoji) and test_tokenizer.py here.
"""

import io
import random
from pathlib import Path

import gguf
import numpy as np
import pytest
from tokenizers.decoders import DecodeStream

from libvllm.engine.errors import ModelLoadError, UnsupportedError
from libvllm.engine.gguf.reader import GGUFReader
from libvllm.engine.tokenizers import Tokenizer

GEMMA = Path.home() / ".cache/libvllm/models/gemma-3-270m-Q4_K_M.gguf"
USER_DEFINED = ["<think>", "</think>", "▁▁", "▁▁▁"]
CONTROL = ["<|im_start|>", "<|im_end|>", "<mask>"]
CORPUS = [
    "",
    " ",
    "  ",
    "Hello world",
    " Hello world",
    "   leading spaces",
    "trailing spaces   ",
    "   x    y     z",
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
    "the quick brown fox<think> jumps</think> over",
    "<s>x</s> <unk> <|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<bos>hi<eos> <start_of_turn>user\nHi<end_of_turn>\n<pad><mask>",
    "a<0x41>b ▁ ▁▁x ▁hello",
]
CONTROL_FREE = [t for t in CORPUS if not any(c in t for c in [*CONTROL, "<s>", "<bos>"])]


def training_lines() -> list[str]:
    rng = random.Random(0)
    words = (
        "the quick brown fox jumps over a lazy dog hello world token model data code def "
        "return print café naïve résumé 你好 世界 123 4567 89 x y z"
    ).split()
    tails = ["", ".", "!", "  spaced", "\ttab", "   three"]
    return [
        " ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) + rng.choice(tails)
        for _ in range(3000)
    ]


def train_sentencepiece(add_dummy_prefix: bool, gemma_names: bool):
    """A 400-piece BPE model with byte fallback. transformers' LlamaTokenizer/GemmaTokenizer
    add their default special tokens (<s> </s> / <bos> <eos> <pad>) as new ids when a vocab
    lacks them, so each shape gets those names, as real files have."""
    spm = pytest.importorskip("sentencepiece")
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(training_lines()),
        model_writer=model,
        model_type="bpe",
        vocab_size=400,
        byte_fallback=True,
        character_coverage=0.9995,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=add_dummy_prefix,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        user_defined_symbols=USER_DEFINED,
        control_symbols=CONTROL,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=3,
        bos_piece="<bos>" if gemma_names else "<s>",
        eos_piece="<eos>" if gemma_names else "</s>",
        num_threads=1,
        minloglevel=2,
    )
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


def write_spm_gguf(path: Path, sp, arch: str, add_space_prefix: bool | None) -> None:
    """The vocab as llama.cpp's convert_hf_to_gguf.py writes it (_create_vocab_sentencepiece);
    for Gemma, whitespace pieces stored as real spaces, as the real Gemma files do."""
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        piece = sp.id_to_piece(i)
        kind = 1
        if sp.is_unknown(i):
            kind = 2
        elif sp.is_control(i):
            kind = 3
        elif sp.is_byte(i):
            kind = 6
        elif piece in USER_DEFINED:
            kind = 4
            if arch == "gemma3" and set(piece) == {"▁"}:
                piece = " " * len(piece)
        tokens.append(piece)
        scores.append(sp.get_score(i))
        types.append(kind)
    w = gguf.GGUFWriter(path, arch=arch)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(3)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    if add_space_prefix is not None:
        w.add_add_space_prefix(add_space_prefix)
    w.add_tensor("x", np.zeros(4, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# (arch, tokenizer.ggml.add_space_prefix, sentencepiece add_dummy_prefix)
SYNTHETIC = {
    "llama": ("llama", None, True),
    "llama-prefix": ("llama", True, True),
    "llama-no-prefix": ("llama", False, False),
    "gemma3": ("gemma3", False, False),
}


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """name -> (path, metadata, sentencepiece processor)."""
    out = {}
    for name, (arch, prefix, dummy) in SYNTHETIC.items():
        sp = train_sentencepiece(dummy, gemma_names=arch == "gemma3")
        path = tmp_path_factory.mktemp(name) / f"{name}.gguf"
        write_spm_gguf(path, sp, arch, prefix)
        out[name] = (path, GGUFReader(path).metadata, sp)
    return out


def hf_gguf_tokenizer(path: Path):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def assert_same_as_transformers(tok: Tokenizer, hf, corpus: list[str]) -> None:
    for text in corpus:
        for add in (True, False):
            assert tok.encode(text, add) == hf(text, add_special_tokens=add)["input_ids"], text
        ids = hf(text)["input_ids"]
        for skip in (True, False):
            assert tok.decode(ids, skip) == hf.decode(ids, skip_special_tokens=skip), text
    assert (tok.bos_token, tok.eos_token) == (hf.bos_token, hf.eos_token)
    assert (tok.bos_token_id, tok.eos_token_id) == (hf.bos_token_id, hf.eos_token_id)
    assert set(hf.all_special_ids) <= set(tok.all_special_ids)
    assert tok.vocab_size == len(hf)


# --- (a) transformers on the same GGUF ------------------------------------------------------


@pytest.mark.parametrize("name", ["llama", "llama-prefix", "gemma3"])
def test_synthetic_matches_transformers(synthetic, name):
    path, md, _ = synthetic[name]
    assert_same_as_transformers(Tokenizer.from_gguf_metadata(md), hf_gguf_tokenizer(path), CORPUS)


@pytest.fixture(scope="module")
def gemma():
    if not GEMMA.is_file():
        pytest.skip(f"{GEMMA} absent (make fetch-gemma downloads it)")
    md = GGUFReader(GEMMA).metadata
    return md, Tokenizer.from_gguf_metadata(md)


@pytest.mark.slow
def test_gemma3_matches_transformers(gemma):
    """The class AutoTokenizer picks for Gemma 3, loaded as it loads it: AutoTokenizer itself
    first reads the whole 262k-token metadata with the gguf package (~20 s) only for the
    config that names the class (gemma3 -> gemma3_text)."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES

    _, tok = gemma
    assert TOKENIZER_MAPPING_NAMES["gemma3_text"] == "GemmaTokenizer"
    hf = transformers.GemmaTokenizer.from_pretrained(GEMMA.parent, gguf_file=GEMMA.name)
    assert_same_as_transformers(tok, hf, CORPUS)


def test_gemma3_fields(gemma):
    md, tok = gemma
    assert tok.vocab_size == 262144 and tok.chat_template is None
    assert (tok.bos_token_id, tok.eos_token_id, tok.unk_token_id, tok.pad_token_id) == (2, 1, 3, 0)
    assert (tok.bos_token, tok.eos_token) == ("<bos>", "<eos>")
    control = [i for i, t in enumerate(md["tokenizer.ggml.token_type"]) if t == 3]
    assert tok.all_special_ids == control and len(control) == 6249
    assert tok.encode("Hello") == [2, tok.backend.token_to_id("Hello")]
    # "  " (id 138) is stored as spaces, spelled "▁▁" in the vocab, and not an added token
    assert md["tokenizer.ggml.tokens"][138] == "  " and tok.id_to_piece(138) == "▁▁"
    assert tok.encode("a  b", False) == [tok.backend.token_to_id(p) for p in ("a", "▁▁", "b")]
    assert tok.encode("\n\n", False) == [108]  # a user-defined token, matched whole


# --- (b) the sentencepiece model itself -------------------------------------------------------


@pytest.mark.parametrize("name", SYNTHETIC)
def test_synthetic_matches_sentencepiece(synthetic, name):
    _, md, sp = synthetic[name]
    tok = Tokenizer.from_gguf_metadata(md)
    arch, _, prefixed = SYNTHETIC[name]
    # Where transformers (the oracle above) differs from sentencepiece: sentencepiece adds its
    # "▁" even before a leading space, Metaspace does not; sentencepiece cuts user-defined
    # space runs ("▁▁▁") out first, transformers' Gemma vocab merges them by file position.
    for text in CONTROL_FREE:
        if prefixed and text.startswith(" ") or arch == "gemma3" and "  " in text.replace("▁", " "):
            continue
        assert tok.encode(text, add_special_tokens=False) == sp.encode(text), text
        assert tok.decode(sp.encode(text)) == sp.decode(sp.encode(text)), text
    assert tok.encode("x")[0] == 1  # BOS


def test_no_space_prefix_differs_from_transformers_only_by_the_prefix(synthetic):
    path, md, _ = synthetic["llama-no-prefix"]
    tok, hf = Tokenizer.from_gguf_metadata(md), hf_gguf_tokenizer(path)
    assert tok.encode("the fox", False) != hf("the fox", add_special_tokens=False)["input_ids"]
    for text in CONTROL_FREE:  # transformers prefixes "▁" (unless there is one) regardless
        ids = hf(text, add_special_tokens=False)["input_ids"]
        assert tok.encode(text if text[:1] in ("", " ") else " " + text, False) == ids, text


def test_byte_fallback_and_streaming(synthetic):
    tok = Tokenizer.from_gguf_metadata(synthetic["llama"][1])
    ids = tok.encode("😀", add_special_tokens=False)
    assert [tok.id_to_piece(i) for i in ids] == ["▁", "<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]
    text = "Emoji 👨‍👩‍👧 and 日本 <|im_end|> ok"
    stream = DecodeStream(skip_special_tokens=False)
    pieces = [stream.step(tok.backend, i) for i in tok.encode(text, add_special_tokens=False)]
    assert "".join(p for p in pieces if p) == text  # the "▁" prefix is stripped
    assert tok.decode(tok.encode(text, add_special_tokens=False), False) == text


@pytest.mark.parametrize("name", SYNTHETIC)
def test_id_to_bytes_round_trips_text(synthetic, name):
    """llama_token_to_piece: "▁" is a space, <0xNN> that byte; the pieces' bytes are the text
    (with the prefix space where the vocab adds one: before text that does not start with a
    space or a special token)."""
    arch, _, prefixed = SYNTHETIC[name]
    tok = Tokenizer.from_gguf_metadata(synthetic[name][1])
    for text in CORPUS:
        ids = tok.encode(text, add_special_tokens=False)
        plain_start = ids and ids[0] not in tok.all_special_ids and text[0] != " "
        prefix = " " if prefixed and plain_start else ""
        expected = (prefix + text).replace("▁", " ").encode()
        assert b"".join(tok.id_to_bytes(i) for i in ids) == expected, text
    assert tok.id_to_bytes(tok.backend.token_to_id("<0xF0>")) == b"\xf0"


def test_special_tokens_matched_whole(synthetic):
    tok = Tokenizer.from_gguf_metadata(synthetic["llama"][1])
    vocab = tok.backend.get_vocab()
    assert tok.encode("<|im_start|><think>", False) == [vocab["<|im_start|>"], vocab["<think>"]]
    assert tok.decode([1, vocab["<|im_start|>"], vocab["<think>"], 2]) == "<think>"
    assert tok.all_special_ids == [0, 1, 2, 3, *(vocab[c] for c in CONTROL)]


# --- (c) malformed metadata -------------------------------------------------------------------


def edited(md: dict, changes: dict) -> dict:
    """md with changes applied; a None value removes the key."""
    out = dict(md)
    for key, value in changes.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def test_malformed_spm_metadata(synthetic):
    md = synthetic["llama"][1]
    n = len(md["tokenizer.ggml.tokens"])
    bad = {
        "no scores": {"tokenizer.ggml.scores": None},
        "scores too short": {"tokenizer.ggml.scores": [0.0] * (n - 1)},
        "scores not numbers": {"tokenizer.ggml.scores": ["1"] * n},
        "NaN score": {"tokenizer.ggml.scores": [float("nan")] * n},
        "duplicate tokens": {"tokenizer.ggml.tokens": ["a"] * n},
        "add_space_prefix not a bool": {"tokenizer.ggml.add_space_prefix": 1},
        "architecture not a string": {"general.architecture": 3},
        "merge without space": {"tokenizer.ggml.merges": ["ab"]},
        "merge out of vocab": {"tokenizer.ggml.merges": ["q zzz"]},
    }
    for name, change in bad.items():
        with pytest.raises(ModelLoadError):
            Tokenizer.from_gguf_metadata(edited(md, change))
            pytest.fail(name)


def test_gemma_asking_for_a_prefix_is_unsupported(synthetic):
    md = edited(synthetic["gemma3"][1], {"tokenizer.ggml.add_space_prefix": True})
    with pytest.raises(UnsupportedError, match="add_space_prefix"):
        Tokenizer.from_gguf_metadata(md)


def test_gemma_ignores_scores(synthetic):
    md = synthetic["gemma3"][1]
    ref = Tokenizer.from_gguf_metadata(md)
    tok = Tokenizer.from_gguf_metadata(edited(md, {"tokenizer.ggml.scores": None}))
    assert all(tok.encode(t) == ref.encode(t) for t in CORPUS)


def test_merges_in_the_file_are_used(synthetic):
    md = synthetic["llama"][1]
    tok = Tokenizer.from_gguf_metadata(edited(md, {"tokenizer.ggml.merges": ["▁ t"]}))
    vocab = tok.backend.get_vocab()
    assert tok.encode("the", False) == [vocab["▁t"], vocab["h"], vocab["e"]]

