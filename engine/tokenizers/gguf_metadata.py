"""Checked reads of a GGUF's `tokenizer.*` metadata, and the parts both vocab types share.

Owns type/range checks of every tokenizer key before use (a GGUF is hostile input), the
special-token rules and the BOS/EOS post-processor. Mirrors transformers'
integrations/gguf/gguf_tokenizer_mapping.py (get_gguf_tokenizer, add_gguf_special_tokens) and
tokenization_utils_tokenizers.py (update_post_processor); key names from llama.cpp
gguf-py/gguf/constants.py (Keys.Tokenizer) and token types from llama.h (llama_token_type).
"""

from __future__ import annotations

from tokenizers import AddedToken, processors
from tokenizers import Tokenizer as HFTokenizer

from libvllm.engine.errors import ModelLoadError

TOKEN_TYPE_NORMAL = 1  # llama.cpp LLAMA_TOKEN_TYPE_*
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
SPECIAL_ID_KEYS = {
    "bos": "tokenizer.ggml.bos_token_id",
    "eos": "tokenizer.ggml.eos_token_id",
    "unk": "tokenizer.ggml.unknown_token_id",
    "pad": "tokenizer.ggml.padding_token_id",
}


def get(md: dict, key: str, kind: type, default: object = None) -> object:
    """md[key] checked to be a `kind` (a bool is not an int here), or `default` if absent."""
    if key not in md:
        return default
    value = md[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ModelLoadError(
            f"GGUF metadata {key} is a {type(value).__name__}, not {kind.__name__}"
        )
    return value


def str_list(md: dict, key: str) -> list[str] | None:
    value = get(md, key, list)
    if value is not None and not all(isinstance(v, str) for v in value):
        raise ModelLoadError(f"GGUF metadata {key} must be an array of strings")
    return value


def per_token(md: dict, key: str, n_tokens: int, kinds: tuple[type, ...]) -> list | None:
    """An array with one `kinds` value per token, or None if absent."""
    values = get(md, key, list)
    if values is None:
        return None
    if len(values) != n_tokens:
        raise ModelLoadError(f"GGUF {key} has {len(values)} entries for {n_tokens} tokens")
    if not all(isinstance(v, kinds) and not isinstance(v, bool) for v in values):
        names = " or ".join(k.__name__ for k in kinds)
        raise ModelLoadError(f"GGUF metadata {key} must be an array of {names}")
    return values


def token_types(md: dict, n_tokens: int) -> list[int]:
    types = per_token(md, "tokenizer.ggml.token_type", n_tokens, (int,))
    return [TOKEN_TYPE_NORMAL] * n_tokens if types is None else types


def special_ids(md: dict, n_tokens: int) -> dict[str, int | None]:
    """bos/eos/unk/pad -> token id (checked to be in the vocab) or None."""
    ids = {}
    for name, key in SPECIAL_ID_KEYS.items():
        token_id = get(md, key, int)
        if token_id is not None and not 0 <= token_id < n_tokens:
            raise ModelLoadError(f"GGUF {key} = {token_id} is outside the {n_tokens}-token vocab")
        ids[name] = token_id
    return ids


def merges(md: dict) -> list[tuple[str, str]] | None:
    """tokenizer.ggml.merges as pairs, or None if absent."""
    lines = str_list(md, "tokenizer.ggml.merges")
    if lines is None:
        return None
    pairs = []
    for merge in lines:
        cut = merge.find(" ", 1)  # llama.cpp: the first space after the first character
        if cut == -1:
            raise ModelLoadError(f"GGUF merge {merge!r} is not two tokens separated by a space")
        pairs.append((merge[:cut], merge[cut + 1 :]))
    return pairs


def add_special_tokens(
    backend: HFTokenizer, tokens: list[str], types: list[int], named: dict[str, int | None]
) -> None:
    """Control tokens and the named bos/eos/unk/pad become special added tokens, user-defined
    ones plain added tokens, so that text spelling them is matched whole. A token is added only
    where the vocab holds its spelling under its own id: transformers would give any other one
    a fresh id past the model's vocab (a byte-level control token spelled in raw text)."""
    vocab = backend.get_vocab()
    named_ids = {i for i in named.values() if i is not None}

    def spelled(i: int) -> bool:
        return vocab.get(tokens[i]) == i

    special = [
        i for i, ty in enumerate(types) if (ty == TOKEN_TYPE_CONTROL or i in named_ids)
    ]
    user = [i for i, ty in enumerate(types) if ty == TOKEN_TYPE_USER_DEFINED and i not in named_ids]
    backend.add_special_tokens(
        [AddedToken(tokens[i], normalized=False, special=True) for i in special if spelled(i)]
    )
    backend.add_tokens(
        [AddedToken(tokens[i], normalized=False, special=False) for i in user if spelled(i)]
    )


def post_processor(
    md: dict, tokens: list[str], named: dict[str, int | None], add_bos_default: bool
) -> processors.PostProcessor | None:
    """BOS before / EOS after the text as tokenizer.ggml.add_bos/eos_token say. The template
    names them "bos"/"eos": a token's own text ("$A", "a:b") would be parsed as template syntax."""
    pieces: dict[str, list[str]] = {"bos": [], "eos": []}
    special = []
    for name, default in (("bos", add_bos_default), ("eos", False)):
        if not get(md, f"tokenizer.ggml.add_{name}_token", bool, default):
            continue
        token_id = named[name]
        if token_id is None:
            raise ModelLoadError(f"GGUF asks to add {name.upper()} but has no {name} token id")
        pieces[name] = [name]
        special.append({"id": name, "ids": [token_id], "tokens": [tokens[token_id]]})
    if not special:
        return None
    return processors.TemplateProcessing(
        single=[*pieces["bos"], "$A", *pieces["eos"]], special_tokens=special
    )
