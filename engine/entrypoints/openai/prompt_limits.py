"""Prompt text -> token ids without holding anyone up: a length bound before tokenizing.

A text prompt is tokenized by the `tokenizers` backend, which holds the GIL for the whole
call (10 MB of text: ~10 s in which no other thread of the process runs). vLLM tokenizes in
a thread pool (vllm/tokenizers/ async tokenizer) so its event loop keeps serving; here
encode_prompt refuses, before tokenizing, a text that provably has more tokens than the
context (vLLM's "maximum context length" 400 of vllm/renderers/params.py), and tokenizes
the rest outside the engine's lock with the GIL released (Tokenizer.encode).

The bound: no token spells more than `longest` characters of normalized text, so a text
of c characters has at least ceil(c / longest) tokens, provided normalization never
removes characters. That holds without a normalizer (byte-level BPE) and for
Replace(" ", "▁") (sentencepiece GGUFs); for any other normalizer there is no bound and
the text is only tokenized off the lock.
"""

from __future__ import annotations

import json
import weakref

from libvllm.engine.entrypoints.openai.errors import VLLMValidationError

_LONGEST: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Tokenizer -> int | None


def longest_token_chars(tok) -> int | None:
    """The longest vocab entry in characters, or None if the backend's normalizer can
    shorten text (then a character count bounds nothing)."""
    if tok not in _LONGEST:
        backend = tok.backend
        bounded = backend.normalizer is None or _keeps_length(backend.normalizer)
        _LONGEST[tok] = max(map(len, backend.get_vocab(with_added_tokens=True)), default=1) \
            if bounded else None
    return _LONGEST[tok]


def _keeps_length(normalizer) -> bool:
    """Replace of one literal character by one or more characters: never shortens."""
    state = json.loads(normalizer.__getstate__())
    pattern = state.get("pattern") or {}
    return state.get("type") == "Replace" and len(pattern.get("String") or "") == 1 and \
        len(state.get("content") or "") >= 1


def too_long_error(max_model_len: int, n_tokens: int, at_least: bool = False
                   ) -> VLLMValidationError:
    """vLLM's context-length 400 (renderers/params.py _token_len_check)."""
    count = f"at least {n_tokens}" if at_least else str(n_tokens)
    return VLLMValidationError(
        f"This model's maximum context length is {max_model_len} tokens. However, your "
        f"prompt contains {count} input tokens, which exceeds this limit even without any "
        "output tokens. Please reduce the length of the input prompt.",
        parameter="input_tokens")


def encode_prompt(tok, text: str, max_model_len: int, *, add_special_tokens: bool,
                  truncating: bool) -> list[int]:
    """Token ids of a prompt text; a text that cannot fit is refused before tokenizing
    (unless it is to be truncated, which needs its tokens)."""
    longest = longest_token_chars(tok)
    if longest and not truncating:
        at_least = -(-len(text) // longest)
        if at_least > max_model_len:
            raise too_long_error(max_model_len, at_least, at_least=True)
    return tok.encode(text, add_special_tokens=add_special_tokens)
