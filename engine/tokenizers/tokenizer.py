"""Tokenizer: text <-> token ids over a `tokenizers.Tokenizer` backend, with the model's
special tokens and chat templates.

Owns the one tokenizer type the engine uses, whatever the model format: built from a GGUF's
`tokenizer.*` metadata (gguf_bpe / gguf_spm) or a Hugging Face directory (hf). The backend is
what the incremental detokenizer streams with. Mirrors the surface of vllm/tokenizers/
protocol.py (TokenizerLike: encode, decode, bos/eos ids, all_special_ids, chat template)
that vllm/tokenizers/hf.py gives a transformers tokenizer.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

from tokenizers import Tokenizer as HFTokenizer

from libvllm.engine.errors import InvalidArgumentError, ModelLoadError, UnsupportedError
from libvllm.engine.tokenizers import gguf_metadata, hf
from libvllm.engine.tokenizers.gguf_bpe import (
    CHAR_BYTES,
    LLAMA3_PRES,
    build_bpe_backend,
    to_byte_level,
)
from libvllm.engine.tokenizers.gguf_spm import SPIECE_UNDERLINE, build_spm_backend

NamedTokens = dict[str, tuple[str, int] | None]  # "bos"/"eos"/"unk"/"pad" -> (text, id)
_GIL_FREE_CHARS = 1 << 14  # longer texts are encoded with the GIL released
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _piece_encoding(backend: HFTokenizer) -> str:
    """How vocab pieces spell bytes, read from the decoder: "byte_level" (GPT-2's table),
    "sentencepiece" ("▁" for a space, <0xNN> byte fallback) or "text"."""
    state = backend.decoder.__getstate__() if backend.decoder is not None else b""
    if b'"type":"ByteLevel"' in state:
        return "byte_level"
    return "sentencepiece" if b'"type":"ByteFallback"' in state else "text"


class Tokenizer:
    """Encode/decode with a model's vocabulary; `backend` is the `tokenizers.Tokenizer`.

    `chat_templates` maps template names to Jinja sources ("default", and any others a
    directory names); `chat_template` is the default one, or None. `all_special_ids`: the
    backend's special added tokens, the named ones and `special_ids`."""

    def __init__(
        self,
        backend: HFTokenizer,
        named: NamedTokens,
        chat_templates: dict[str, str],
        special_ids: Sequence[int] = (),
    ) -> None:
        self.backend = backend
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        self.bos_token, self.bos_token_id = named.get("bos") or (None, None)
        self.eos_token, self.eos_token_id = named.get("eos") or (None, None)
        self.unk_token_id = (named.get("unk") or (None, None))[1]
        self.pad_token_id = (named.get("pad") or (None, None))[1]
        self.chat_templates = chat_templates
        self.chat_template = chat_templates.get("default")
        special = {i for i, t in backend.get_added_tokens_decoder().items() if t.special}
        special |= {v[1] for v in named.values() if v is not None} | set(special_ids)
        self.all_special_ids = sorted(special)
        self._piece_encoding = _piece_encoding(backend)

    @classmethod
    def from_gguf_metadata(cls, md: dict[str, object]) -> Tokenizer:
        """From tokenizer.ggml.* keys: 'gpt2' (byte-level BPE) or 'llama' (SentencePiece)."""
        model = gguf_metadata.get(md, "tokenizer.ggml.model", str)
        if model is None:
            raise ModelLoadError("GGUF has no tokenizer (tokenizer.ggml.model is missing)")
        if model not in ("gpt2", "llama"):
            raise UnsupportedError(
                f"tokenizer.ggml.model {model!r} is not supported; only 'gpt2' (byte-level "
                "BPE) and 'llama' (SentencePiece) are"
            )
        tokens = gguf_metadata.str_list(md, "tokenizer.ggml.tokens")
        if not tokens:
            raise ModelLoadError("GGUF tokenizer.ggml.tokens is missing or empty")
        types = gguf_metadata.token_types(md, len(tokens))
        ids = gguf_metadata.special_ids(md, len(tokens))
        if model == "gpt2":
            backend = build_bpe_backend(md, tokens)
            add_bos = gguf_metadata.get(md, "tokenizer.ggml.pre", str) in LLAMA3_PRES
        else:
            backend = build_spm_backend(md, tokens, ids)
            add_bos = True  # llama.cpp and transformers add BOS to sentencepiece by default
        gguf_metadata.add_special_tokens(backend, tokens, types, ids)
        if backend.get_vocab_size(with_added_tokens=True) != len(tokens):
            raise ModelLoadError("GGUF tokenizer added tokens outside its vocab")
        backend.post_processor = gguf_metadata.post_processor(md, tokens, ids, add_bos)
        template = gguf_metadata.get(md, "tokenizer.chat_template", str)
        named = {n: None if i is None else (tokens[i], i) for n, i in ids.items()}
        return cls(backend, named, {} if template is None else {"default": template})

    @classmethod
    def from_hf_dir(cls, path: str | os.PathLike) -> Tokenizer:
        """From a Hugging Face directory: tokenizer.json, tokenizer_config.json, chat template
        files. Nothing in the directory is executed."""
        backend, named, special_ids, templates = hf.load_hf_dir(os.fspath(path))
        return cls(backend, named, templates, special_ids)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; special tokens written in it are matched whole. With
        add_special_tokens, BOS/EOS are added as the model's tokenizer says."""
        if not isinstance(text, str):
            raise InvalidArgumentError(f"text to encode must be a str, got {type(text).__name__}")
        if len(text) < _GIL_FREE_CHARS:
            return self.backend.encode(text, add_special_tokens=add_special_tokens).ids
        # encode_batch releases the GIL (encode holds it: seconds for megabytes of text)
        return self.backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        for i in ids:
            self._check_id(i)
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_piece(self, token_id: int) -> str:
        """The token as the backend's vocab spells it (byte-level: "Ġhello", SPM: "▁hello")."""
        self._check_id(token_id)
        piece = self.backend.id_to_token(token_id)
        if piece is None:
            raise InvalidArgumentError(f"token id {token_id} is not in the vocab")
        return piece

    def id_to_bytes(self, token_id: int) -> bytes:
        """The bytes the token stands for (llama.cpp llama_token_to_piece, special tokens
        as their text): a byte-level piece mapped back through GPT-2's table, a sentencepiece
        "▁" as a space and <0xNN> as that byte, other pieces as UTF-8."""
        piece = self.id_to_piece(token_id)
        if self._piece_encoding == "byte_level":
            return bytes(CHAR_BYTES[c] for c in to_byte_level(piece))
        if self._piece_encoding == "sentencepiece":
            byte = _BYTE_PIECE.fullmatch(piece)
            if byte:
                return bytes([int(byte.group(1), 16)])
            piece = piece.replace(SPIECE_UNDERLINE, " ")
        return piece.encode("utf-8")

    def _check_id(self, token_id: object) -> None:
        if not isinstance(token_id, int) or isinstance(token_id, bool):
            raise InvalidArgumentError(f"token id must be an int, got {type(token_id).__name__}")
        if not 0 <= token_id < self.vocab_size:
            raise InvalidArgumentError(
                f"token id {token_id} is outside the vocab [0, {self.vocab_size})"
            )
