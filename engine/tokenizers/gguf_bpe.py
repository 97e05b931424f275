"""Byte-level BPE ('gpt2') vocabularies from GGUF metadata -> a `tokenizers` BPE.

Mirrors transformers' integrations/gguf/gguf_tokenizer_mapping.py (byte_level_tokenizer,
set_split_regex): vocab + merges, tokens stored as raw text respelled in GPT-2's byte
alphabet, with the pre-tokenizer split picked the way llama.cpp's llama-vocab.cpp maps
`tokenizer.ggml.pre`.

Known difference from transformers: for "smollm" (and the other pre types llama.cpp splits
digits for) every digit is isolated before the GPT-2 split, as llama.cpp and the model's
original tokenizer.json do; transformers' GGUF conversion skips that step, so "x  1" gives
x/ĠĠ/1 here and x/Ġ/Ġ/1 there.
"""

from __future__ import annotations

import logging

from tokenizers import Regex, decoders, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import BPE

from libvllm.engine.errors import ModelLoadError
from libvllm.engine.tokenizers import gguf_metadata

logger = logging.getLogger(__name__)

# Split regexes, as in llama-vocab.cpp (llm_tokenizer_bpe) / the models' tokenizer.json.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_DIGIT = r"\p{N}"
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# llama.cpp looks a whole pre-token up in the vocab before merging, and adds BOS unless the
# file says otherwise, for these.
LLAMA3_PRES = frozenset(
    ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2")
)
# tokenizer.ggml.pre -> the regexes applied in turn (each splits the pieces of the last).
_PRE_SPLITS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("gpt-2", "gpt2", "phi-2", "mpt", "olmo", "jais", "exaone4"), (_GPT2,)),
    **dict.fromkeys(
        ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"),
        (_DIGIT, _GPT2),
    ),
    **dict.fromkeys((*LLAMA3_PRES, "dbrx", "smaug-bpe"), (_LLAMA3,)),
    **dict.fromkeys(
        ("qwen2", "deepseek-r1-qwen", "kormo", "megrez", "stablelm2", "hunyuan"), (_QWEN2,)
    ),
    **dict.fromkeys(("gpt-4o", "llama4", "minimax-m2"), (_GPT4O,)),
}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (the byte-level BPE alphabet)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


BYTE_CHARS = _bytes_to_unicode()
CHAR_BYTES = {char: byte for byte, char in BYTE_CHARS.items()}
_ALPHABET = frozenset(BYTE_CHARS.values())


def to_byte_level(token: str) -> str:
    """The token in the byte-level alphabet (files store some added tokens as raw text)."""
    if set(token) <= _ALPHABET:
        return token
    return "".join(BYTE_CHARS[b] for b in token.encode("utf-8"))


def _pre_tokenizer(pre: str | None) -> pre_tokenizers.PreTokenizer:
    """Regex splits for `pre`, then bytes -> the byte-level alphabet."""
    splits = _PRE_SPLITS.get(pre)
    if splits is None:  # llama.cpp warns and falls back too; transformers uses GPT-2's split
        logger.warning("missing or unknown tokenizer.ggml.pre %r: splitting text like GPT-2", pre)
        splits = (_GPT2,)
    return pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )


def build_bpe_backend(md: dict, tokens: list[str]) -> HFTokenizer:
    """The byte-level BPE model, pre-tokenizer and decoder (special tokens come later)."""
    pre = gguf_metadata.get(md, "tokenizer.ggml.pre", str)
    merges = gguf_metadata.merges(md)
    if merges is None:
        raise ModelLoadError("GGUF byte-level BPE tokenizer has no tokenizer.ggml.merges")
    vocab = {to_byte_level(t): i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ModelLoadError("GGUF tokenizer.ggml.tokens has duplicate tokens")
    try:
        model = BPE(vocab=vocab, merges=merges, fuse_unk=False, ignore_merges=pre in LLAMA3_PRES)
    except Exception as exc:  # tokenizers raises a bare Exception for bad merges
        raise ModelLoadError(f"GGUF tokenizer merges do not fit the vocab: {exc}") from exc
    backend = HFTokenizer(model)
    backend.pre_tokenizer = _pre_tokenizer(pre)
    backend.decoder = decoders.ByteLevel()
    return backend
