"""Tokenizer: text <-> token ids, built from a GGUF file's `tokenizer.*` metadata.

Owns turning llama.cpp's tokenizer keys into a `tokenizers.Tokenizer` (the backend the
incremental detokenizer streams with). Mirrors transformers'
integrations/gguf/gguf_tokenizer_mapping.py (byte-level BPE from vocab + merges, control
tokens added as special tokens, user-defined tokens as plain added tokens), with the
pre-tokenizer split picked the way llama.cpp's llama-vocab.cpp maps `tokenizer.ggml.pre`.

Known difference from transformers: for "smollm" (and the other pre types llama.cpp splits
digits for) every digit is isolated before the GPT-2 split, as llama.cpp and the model's
original tokenizer.json do; transformers' GGUF conversion skips that step, so "x  1" gives
x/ĠĠ/1 here and x/Ġ/Ġ/1 there.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from tokenizers import AddedToken, Regex, decoders, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import BPE

from engine.errors import InvalidArgumentError, ModelLoadError, UnsupportedError

logger = logging.getLogger(__name__)

TOKEN_TYPE_CONTROL = 3  # llama.cpp LLAMA_TOKEN_TYPE_CONTROL
TOKEN_TYPE_USER_DEFINED = 4  # llama.cpp LLAMA_TOKEN_TYPE_USER_DEFINED
_SPECIAL_ID_KEYS = {
    "bos": "tokenizer.ggml.bos_token_id",
    "eos": "tokenizer.ggml.eos_token_id",
    "unk": "tokenizer.ggml.unknown_token_id",
    "pad": "tokenizer.ggml.padding_token_id",
}

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
_LLAMA3_PRES = frozenset(
    ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2")
)
# tokenizer.ggml.pre -> the regexes applied in turn (each splits the pieces of the last).
_PRE_SPLITS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("gpt-2", "gpt2", "phi-2", "mpt", "olmo", "jais", "exaone4"), (_GPT2,)),
    **dict.fromkeys(
        ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"),
        (_DIGIT, _GPT2),
    ),
    **dict.fromkeys((*_LLAMA3_PRES, "dbrx", "smaug-bpe"), (_LLAMA3,)),
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


_BYTE_CHARS = _bytes_to_unicode()
_ALPHABET = frozenset(_BYTE_CHARS.values())


def _byte_level(token: str) -> str:
    """The token in the byte-level alphabet (files store some added tokens as raw text)."""
    if set(token) <= _ALPHABET:
        return token
    return "".join(_BYTE_CHARS[b] for b in token.encode("utf-8"))


def _get(md: dict, key: str, kind: type, default: object = None) -> object:
    """md[key] checked to be a `kind` (a bool is not an int here), or `default` if absent."""
    if key not in md:
        return default
    value = md[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ModelLoadError(
            f"GGUF metadata {key} is a {type(value).__name__}, not {kind.__name__}"
        )
    return value


def _str_list(md: dict, key: str) -> list[str] | None:
    value = _get(md, key, list)
    if value is not None and not all(isinstance(v, str) for v in value):
        raise ModelLoadError(f"GGUF metadata {key} must be an array of strings")
    return value


def _token_types(md: dict, n_tokens: int) -> list[int]:
    types = _get(md, "tokenizer.ggml.token_type", list)
    if types is None:
        return [1] * n_tokens
    if len(types) != n_tokens:
        raise ModelLoadError(
            f"GGUF tokenizer.ggml.token_type has {len(types)} entries for {n_tokens} tokens"
        )
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in types):
        raise ModelLoadError("GGUF metadata tokenizer.ggml.token_type must be an array of ints")
    return types


def _token_id(md: dict, key: str, n_tokens: int) -> int | None:
    token_id = _get(md, key, int)
    if token_id is not None and not 0 <= token_id < n_tokens:
        raise ModelLoadError(f"GGUF {key} = {token_id} is outside the {n_tokens}-token vocab")
    return token_id


def _merges(md: dict) -> list[tuple[str, str]]:
    merges = _str_list(md, "tokenizer.ggml.merges")
    if merges is None:
        raise ModelLoadError("GGUF byte-level BPE tokenizer has no tokenizer.ggml.merges")
    pairs = []
    for merge in merges:
        cut = merge.find(" ", 1)  # llama.cpp: the first space after the first character
        if cut == -1:
            raise ModelLoadError(f"GGUF merge {merge!r} is not two tokens separated by a space")
        pairs.append((merge[:cut], merge[cut + 1 :]))
    return pairs


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


def _post_processor(
    bos: tuple[str, int] | None, eos: tuple[str, int] | None
) -> processors.PostProcessor | None:
    """Adds BOS before / EOS after the text when the file asks for them."""
    if bos is None and eos is None:
        return None
    single = [*(bos[:1] if bos else ()), "$A", *(eos[:1] if eos else ())]
    return processors.TemplateProcessing(
        single=single, special_tokens=[t for t in (bos, eos) if t is not None]
    )


def _build_backend(
    tokens: list[str], types: list[int], merges: list[tuple[str, str]], pre: str | None
) -> HFTokenizer:
    vocab = {_byte_level(t): i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ModelLoadError("GGUF tokenizer.ggml.tokens has duplicate tokens")
    try:
        model = BPE(vocab=vocab, merges=merges, fuse_unk=False, ignore_merges=pre in _LLAMA3_PRES)
    except Exception as exc:  # tokenizers raises a bare Exception for bad merges
        raise ModelLoadError(f"GGUF tokenizer merges do not fit the vocab: {exc}") from exc
    backend = HFTokenizer(model)
    backend.pre_tokenizer = _pre_tokenizer(pre)
    backend.decoder = decoders.ByteLevel()
    # A control token spelled outside the byte alphabet would get a fresh id: skip it (as
    # transformers does); user-defined tokens are added only when their spelling is in the vocab.
    backend.add_special_tokens(
        [
            AddedToken(t, normalized=False, special=True)
            for t, ty in zip(tokens, types)
            if ty == TOKEN_TYPE_CONTROL and set(t) <= _ALPHABET
        ]
    )
    backend.add_tokens(
        [
            AddedToken(t, normalized=False, special=False)
            for t, ty in zip(tokens, types)
            if ty == TOKEN_TYPE_USER_DEFINED and t in vocab
        ]
    )
    return backend


class Tokenizer:
    """Encode/decode with the GGUF's vocabulary; `backend` is the `tokenizers.Tokenizer`."""

    def __init__(
        self,
        backend: HFTokenizer,
        tokens: list[str],
        types: list[int],
        special_ids: dict[str, int | None],
        chat_template: str | None,
    ) -> None:
        self.backend = backend
        self._tokens = tokens
        self.vocab_size = len(tokens)
        self.bos_token_id = special_ids["bos"]
        self.eos_token_id = special_ids["eos"]
        self.unk_token_id = special_ids["unk"]
        self.pad_token_id = special_ids["pad"]
        self.chat_template = chat_template
        control = {i for i, t in enumerate(types) if t == TOKEN_TYPE_CONTROL}
        named = {i for i in special_ids.values() if i is not None}
        self.all_special_ids = sorted(control | named)

    @classmethod
    def from_gguf_metadata(cls, md: dict[str, object]) -> Tokenizer:
        model = _get(md, "tokenizer.ggml.model", str)
        if model is None:
            raise ModelLoadError("GGUF has no tokenizer (tokenizer.ggml.model is missing)")
        if model != "gpt2":
            hint = " (SentencePiece 'llama' vocabularies come later)" if model == "llama" else ""
            raise UnsupportedError(
                f"tokenizer.ggml.model {model!r} is not supported{hint}; only 'gpt2' "
                "(byte-level BPE) is"
            )
        tokens = _str_list(md, "tokenizer.ggml.tokens")
        if not tokens:
            raise ModelLoadError("GGUF tokenizer.ggml.tokens is missing or empty")
        types = _token_types(md, len(tokens))
        pre = _get(md, "tokenizer.ggml.pre", str)
        special_ids = {n: _token_id(md, key, len(tokens)) for n, key in _SPECIAL_ID_KEYS.items()}
        backend = _build_backend(tokens, types, _merges(md), pre)
        add_bos = _get(md, "tokenizer.ggml.add_bos_token", bool, pre in _LLAMA3_PRES)
        add_eos = _get(md, "tokenizer.ggml.add_eos_token", bool, False)
        ends = []
        for name, wanted in (("bos", add_bos), ("eos", add_eos)):
            token_id = special_ids[name]
            if wanted and token_id is None:
                raise ModelLoadError(f"GGUF asks to add {name.upper()} but has no {name} token id")
            ends.append((tokens[token_id], token_id) if wanted else None)
        backend.post_processor = _post_processor(*ends)
        chat_template = _get(md, "tokenizer.chat_template", str)
        return cls(backend, tokens, types, special_ids, chat_template)

    @property
    def bos_token(self) -> str | None:
        return None if self.bos_token_id is None else self._tokens[self.bos_token_id]

    @property
    def eos_token(self) -> str | None:
        return None if self.eos_token_id is None else self._tokens[self.eos_token_id]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; special tokens written in it are matched whole. With
        add_special_tokens, BOS/EOS are added as tokenizer.ggml.add_bos/eos_token say."""
        if not isinstance(text, str):
            raise InvalidArgumentError(f"text to encode must be a str, got {type(text).__name__}")
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        for i in ids:
            self._check_id(i)
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_piece(self, token_id: int) -> str:
        """The token as the vocab spells it (byte-level: "Ġhello")."""
        self._check_id(token_id)
        return self._tokens[token_id]

    def _check_id(self, token_id: object) -> None:
        if not isinstance(token_id, int) or isinstance(token_id, bool):
            raise InvalidArgumentError(f"token id must be an int, got {type(token_id).__name__}")
        if not 0 <= token_id < self.vocab_size:
            raise InvalidArgumentError(
                f"token id {token_id} is outside the vocab [0, {self.vocab_size})"
            )
