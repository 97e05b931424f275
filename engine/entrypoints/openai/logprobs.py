"""OpenAI logprobs shapes from the engine's per-position logprobs.

Input, as vllm/logprobs.py: for each generated token one dict {token_id: Logprob} (objects
with .logprob and .decoded_token; the sampled token first, then the top-k in rank order), or
None. Mirrors _create_completion_logprobs (vllm/entrypoints/openai/completion/serving.py:
text_offset / token_logprobs / tokens / top_logprobs with logprobs + 1 entries) and
_create_chat_logprobs (vllm/entrypoints/openai/chat_completion/serving.py: content[{token,
logprob, bytes, top_logprobs}]); -inf becomes -9999.0 as in vLLM.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

from libvllm.engine.entrypoints.openai.chat_protocol import (
    ChatCompletionLogProb,
    ChatCompletionLogProbs,
    ChatCompletionLogProbsContent,
)
from libvllm.engine.entrypoints.openai.completion_protocol import CompletionLogProbs

Decode = Callable[[int], str]


def _token(logprob, token_id: int, decode: Decode, as_token_id: bool) -> str:
    if as_token_id:
        return f"token_id:{token_id}"
    decoded = getattr(logprob, "decoded_token", None)
    return decoded if decoded is not None else decode(token_id)


def completion_top_limit(logprobs: int | None) -> int | None:
    """logprobs + 1 candidates per position (the OpenAI completions convention); all for -1."""
    return None if logprobs is None or logprobs == -1 else max(logprobs + 1, 0)


def chat_top_limit(top_logprobs: int | None) -> int | None:
    return None if top_logprobs == -1 else (top_logprobs or 0)


def completion_logprobs(token_ids: Sequence[int], top_logprobs: Sequence[dict | None],
                        num_top: int, decode: Decode, initial_text_offset: int = 0,
                        as_token_id: bool = False) -> CompletionLogProbs:
    offsets: list[int] = []
    token_lps: list[float | None] = []
    tokens: list[str] = []
    tops: list[dict[str, float] | None] = []
    last_len = 0
    for i, token_id in enumerate(token_ids):
        step = top_logprobs[i]
        if step is None:
            token = f"token_id:{token_id}" if as_token_id else decode(token_id)
            token_lps.append(None)
            tops.append(None)
        else:
            chosen = step[token_id]
            token = _token(chosen, token_id, decode, as_token_id)
            token_lps.append(max(chosen.logprob, -9999.0))
            tops.append({_token(lp, tid, decode, as_token_id): max(lp.logprob, -9999.0)
                         for tid, lp in itertools.islice(step.items(),
                                                         completion_top_limit(num_top))})
        tokens.append(token)
        offsets.append(initial_text_offset if not offsets else offsets[-1] + last_len)
        last_len = len(token)
    return CompletionLogProbs(text_offset=offsets, token_logprobs=token_lps, tokens=tokens,
                              top_logprobs=tops)


def chat_logprobs(token_ids: Sequence[int], top_logprobs: Sequence[dict | None],
                  num_top: int | None, decode: Decode, as_token_id: bool = False
                  ) -> ChatCompletionLogProbs:
    content = []
    for i, token_id in enumerate(token_ids):
        step = top_logprobs[i]
        if step is None or step.get(token_id) is None:
            token = f"token_id:{token_id}" if as_token_id else decode(token_id)
            content.append(ChatCompletionLogProbsContent(
                token=token, bytes=list(token.encode("utf-8", errors="replace"))))
            continue
        chosen = step[token_id]
        decoded = getattr(chosen, "decoded_token", None)
        top = []
        for tid, lp in itertools.islice(step.items(), chat_top_limit(num_top)):
            text = _token(lp, tid, decode, as_token_id)
            top.append(ChatCompletionLogProb(token=text, logprob=max(lp.logprob, -9999.0),
                                             bytes=list(text.encode("utf-8", errors="replace"))))
        content.append(ChatCompletionLogProbsContent(
            token=_token(chosen, token_id, decode, as_token_id),
            logprob=max(chosen.logprob, -9999.0),
            bytes=None if decoded is None else list(decoded.encode("utf-8", errors="replace")),
            top_logprobs=top))
    return ChatCompletionLogProbs(content=content)
