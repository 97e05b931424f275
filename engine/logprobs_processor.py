"""LogprobsProcessor: the logprobs of one request, assembled step by step, as
vllm/v1/engine/logprobs.py.

decoded_token is the token decoded alone (vLLM's convert_ids_list_to_tokens), with a
trailing U+FFFD of a split multi-byte character repaired from the preceding tokens as
vLLM's _verify_tokens does; None when the request has detokenize=False.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from tokenizers import Tokenizer as HFTokenizer

from libvllm.engine.logprobs import (
    PromptLogprobs,
    SampleLogprobs,
    append_logprobs_for_next_position,
)
from libvllm.engine.sample.outputs import LogprobsLists

_REPLACEMENT = "\ufffd"


class LogprobsProcessor:
    def __init__(self, tokenizer: HFTokenizer | None, num_logprobs: int | None,
                 num_prompt_logprobs: int | None) -> None:
        self.tokenizer = tokenizer  # None: detokenize=False
        self.num_logprobs = num_logprobs
        self.num_prompt_logprobs = num_prompt_logprobs
        self.logprobs: SampleLogprobs | None = None if num_logprobs is None else []
        self.cumulative_logprob: float | None = None if num_logprobs is None else 0.0
        self.prompt_logprobs: PromptLogprobs | None = \
            None if num_prompt_logprobs is None else [None]

    def update_from_output(self, new_logprobs: LogprobsLists | None,
                           new_prompt_logprobs: LogprobsLists | None) -> None:
        if new_logprobs is not None and self.logprobs is not None:
            self._update(self.logprobs, new_logprobs, self.num_logprobs, sample=True)
        if new_prompt_logprobs is not None and self.prompt_logprobs is not None:
            self._update(self.prompt_logprobs, new_prompt_logprobs, self.num_prompt_logprobs,
                         sample=False)

    def _update(self, target: list, lists: LogprobsLists, num: int, sample: bool) -> None:
        for token_ids, logprobs, rank in zip(*lists[:3], strict=True):
            decoded: Iterable[str | None] = itertools.repeat(None)
            if self.tokenizer is not None:
                decoded = self._verify_tokens(
                    self.tokenizer.decode_batch([[t] for t in token_ids],
                                                skip_special_tokens=False),
                    token_ids, _context_ids(target))
            if sample:
                self.cumulative_logprob += logprobs[0]
            append_logprobs_for_next_position(target, token_ids, logprobs, decoded, rank, num)

    def pop_prompt_logprobs(self) -> PromptLogprobs | None:
        """All prompt logprobs at once, then forgotten (DELTA outputs carry them once)."""
        plp = self.prompt_logprobs
        if plp:
            self.prompt_logprobs = []
        return plp

    def _verify_tokens(self, decoded: list[str], token_ids: list[int],
                       context: list[int]) -> list[str]:
        return [self._correct_decoded_token(tok, context) if text.endswith(_REPLACEMENT)
                else text for text, tok in zip(decoded, token_ids, strict=True)]

    def _correct_decoded_token(self, token_id: int, context: list[int]) -> str:
        """The text a token completes after (up to 4) preceding tokens whose bytes it
        finishes; "" when the character is still incomplete."""
        decode = self.tokenizer.decode
        for num_ctx in range(1, min(len(context), 4) + 1):
            ctx = context[-num_ctx:]
            full = decode(ctx + [token_id], skip_special_tokens=False)
            if full.endswith(_REPLACEMENT):
                continue
            clean_end = len(ctx)
            for j in range(len(ctx) - 1, -1, -1):
                if not decode([ctx[j]], skip_special_tokens=False).endswith(_REPLACEMENT):
                    break
                clean_end = j
            prefix = decode(ctx[:clean_end], skip_special_tokens=False) if clean_end else ""
            if full.startswith(prefix):
                return full[len(prefix):]
            common = next((i for i, (a, b) in enumerate(zip(prefix, full)) if a != b),
                          min(len(prefix), len(full)))
            return full[common:]
        return ""


def _context_ids(positions: list, max_context: int = 4) -> list[int]:
    """The chosen token of each of the last max_context positions, oldest first."""
    return [next(iter(p)) for p in positions[-max_context:] if p]
