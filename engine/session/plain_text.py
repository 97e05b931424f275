"""Tokenizing text with special-token text left as plain text (vllm_tokenize with
parse_special = 0, llama.h's llama_tokenize(..., parse_special = false)).

The engine's tokenizer matches special tokens written in the text ("<|im_start|>"
becomes the control token), as Hugging Face tokenizers and vLLM's prompts do. For user
input that is a prompt-injection path, so vllm_tokenize can turn it off: this module
keeps, per engine tokenizer, a clone of its `tokenizers.Tokenizer` backend with
`encode_special_tokens` set (special tokens split like any other text; BOS/EOS from the
post-processor still come as tokens). The shared backend is never mutated.
Ours (vLLM has no C tokenize); the switch is the `tokenizers` library's.
"""

from __future__ import annotations

import threading
import weakref

from tokenizers import Tokenizer as HFTokenizer

_clones: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _plain_backend(tokenizer) -> HFTokenizer:
    """The clone of tokenizer.backend that encodes special-token text as plain text."""
    with _lock:
        clone = _clones.get(tokenizer)
        if clone is None:
            clone = HFTokenizer.from_str(tokenizer.backend.to_str())
            clone.encode_special_tokens = True
            _clones[tokenizer] = clone
        return clone


def encode(tokenizer, text: str, *, add_special: bool) -> list[int]:
    """Token ids of text, special-token text tokenized as ordinary text."""
    # encode_batch releases the GIL (encode holds it)
    return _plain_backend(tokenizer).encode_batch([text], add_special_tokens=add_special)[0].ids
