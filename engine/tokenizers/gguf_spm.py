"""SentencePiece ('llama') vocabularies from GGUF metadata -> a `tokenizers` BPE with byte
fallback.

Mirrors transformers' integrations/gguf/gguf_tokenizer_mapping.py (sentencepiece_tokenizer,
gemma_tokenizer, get_merges) and tokenization_utils_base.py (generate_merges), with the
pipelines of models/llama/tokenization_llama.py (LlamaTokenizer: Metaspace "▁" prefix on the
first piece of text, no normalizer) and models/gemma/tokenization_gemma.py (GemmaTokenizer:
spaces -> "▁", no prefix). The file has no merges: they are rebuilt from the vocab, every
split of a token into two vocab tokens, best-scored first (Gemma: earliest in the file, its
scores do not follow its merge order). Missing characters fall back to the <0xNN> tokens.

Known differences (transformers' ids are the oracle otherwise):
- tokenizer.ggml.add_space_prefix = false removes the "▁" prefix of a llama-type vocab, as
  llama.cpp does; transformers ignores the key. A Gemma-type file asking for a prefix is
  refused (no such file is known; GemmaTokenizer has no prefix).
- llama.cpp also prefixes the text after each special token; transformers (and so vLLM)
  prefixes only the start of the text, and so do we.
"""

from __future__ import annotations

import math

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE

from libvllm.engine.errors import ModelLoadError, UnsupportedError
from libvllm.engine.tokenizers import gguf_metadata

SPIECE_UNDERLINE = "▁"
# Architectures whose sentencepiece vocab transformers builds as GemmaTokenizer.
GEMMA_ARCHS = frozenset(("gemma", "gemma2", "gemma3"))


def _ranks(md: dict, tokens: list[str], gemma: bool) -> list[float]:
    """The merge priority of each token: its score, or for Gemma minus its position."""
    if gemma:
        return [-i for i in range(len(tokens))]
    scores = gguf_metadata.per_token(md, "tokenizer.ggml.scores", len(tokens), (int, float))
    if scores is None:
        raise ModelLoadError("GGUF sentencepiece tokenizer has no tokenizer.ggml.scores")
    if any(math.isnan(s) for s in scores):
        raise ModelLoadError("GGUF tokenizer.ggml.scores holds NaN")
    return scores


def implied_merges(vocab: dict[str, int], ranks: list[float]) -> list[tuple[str, str]]:
    """Every (left, right) split of a token into two vocab tokens, ordered by the token's rank
    (highest first), then the longer left, then the longer right piece; ties keep vocab order,
    splits of one token the order of their ids (transformers' generate_merges)."""
    found: list[tuple[float, int, int, str]] = []  # (rank, len left, len right, token)
    for token, rank in zip(vocab, ranks):
        n = len(token)
        cuts = [k for k in range(1, n) if token[:k] in vocab and token[k:] in vocab]
        if len(cuts) > 1:
            cuts.sort(key=lambda k: (vocab[token[:k]], vocab[token[k:]]))
        found += [(rank, k, n - k, token) for k in cuts]
    found.sort(key=lambda m: m[:3], reverse=True)  # stable: ties keep their order
    return [(token[:k], token[k:]) for _, k, _, token in found]


def _respell_spaces(token: str) -> str:
    """Gemma files store whitespace tokens holding spaces ("  ") as text; the vocab spells
    them with one "▁" per character."""
    return SPIECE_UNDERLINE * len(token) if " " in token and not token.strip() else token


def build_spm_backend(md: dict, tokens: list[str], named: dict[str, int | None]) -> HFTokenizer:
    """The BPE model, normalizer, pre-tokenizer and decoder (special tokens come later)."""
    arch = gguf_metadata.get(md, "general.architecture", str)
    gemma = arch in GEMMA_ARCHS
    prefix = gguf_metadata.get(md, "tokenizer.ggml.add_space_prefix", bool, not gemma)
    if gemma and prefix:
        raise UnsupportedError(
            f"GGUF tokenizer.ggml.add_space_prefix = true for a {arch} vocabulary: Gemma "
            "tokenizers add no prefix space"
        )
    spelled = [_respell_spaces(t) for t in tokens] if gemma else tokens
    vocab = {t: i for i, t in enumerate(spelled)}
    if len(vocab) != len(spelled):
        raise ModelLoadError("GGUF tokenizer.ggml.tokens has duplicate tokens")
    merges = gguf_metadata.merges(md)
    if merges is None:
        merges = implied_merges(vocab, _ranks(md, tokens, gemma))
    unk = named["unk"]
    try:
        model = BPE(
            vocab=vocab,
            merges=merges,
            fuse_unk=True,
            byte_fallback=True,
            unk_token=spelled[unk] if gemma and unk is not None else None,
        )
    except Exception as exc:  # tokenizers raises a bare Exception for bad merges
        raise ModelLoadError(f"GGUF tokenizer merges do not fit the vocab: {exc}") from exc
    backend = HFTokenizer(model)
    steps = [decoders.Replace(SPIECE_UNDERLINE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if gemma:
        backend.normalizer = normalizers.Replace(" ", SPIECE_UNDERLINE)
        backend.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    else:
        backend.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement=SPIECE_UNDERLINE, prepend_scheme="first" if prefix else "never", split=False
        )
        steps += [decoders.Strip(content=" ", left=1)] if prefix else []
    backend.decoder = decoders.Sequence(steps)
    return backend
