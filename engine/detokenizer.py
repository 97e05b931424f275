"""IncrementalDetokenizer: token ids -> text as they arrive, plus stop strings.

Mirrors vllm/v1/engine/detokenizer.py. IncrementalDetokenizer itself only tracks the
output token ids (detokenize=False); FastIncrementalDetokenizer streams text with the
`tokenizers` DecodeStream primed with the prompt, which emits text only once a token
completes valid UTF-8, so no broken characters are ever streamed. With
skip_special_tokens=False and spaces_between_special_tokens=False, a special (added)
token right after another is emitted as its raw content. Stop strings are searched in
the new text only (from the first token past min_tokens); when they are excluded from
the output, the last len(stop)-1 chars are held back while streaming.
"""

from __future__ import annotations

import logging
import sys

from tokenizers import Tokenizer as HFTokenizer
from tokenizers.decoders import DecodeStream

from libvllm.engine.sampling_params import SamplingParams

logger = logging.getLogger(__name__)
INVALID_PREFIX_ERR_MSG = "Invalid prefix encountered"  # tokenizers' DecodeStream error


def check_stop_strings(output_text: str, new_char_count: int, stop: list[str],
                       include_in_output: bool) -> tuple[str, int] | None:
    """Return (stop string, truncate-to offset or -1), or None; earliest end wins."""
    if not new_char_count or not stop:
        return None
    best, best_idx, best_end = None, 0, sys.maxsize
    for s in stop:
        idx = output_text.find(s, 1 - new_char_count - len(s))
        if idx != -1 and idx + len(s) < best_end:
            best, best_idx, best_end = s, idx, idx + len(s)
    if best is None:
        return None
    if include_in_output:
        return best, (-1 if best_end >= len(output_text) else best_end)
    return best, best_idx


class IncrementalDetokenizer:
    """No tokenizer (detokenize=False): token ids only, no text, no stop strings."""

    def __init__(self) -> None:
        self.token_ids: list[int] = []

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids

    def num_output_tokens(self) -> int:
        return len(self.token_ids)

    def update(self, new_token_ids: list[int], stop_terminated: bool) -> str | None:
        self.token_ids.extend(new_token_ids)
        return None

    def get_next_output_text(self, finished: bool, delta: bool) -> str:
        return ""

    @staticmethod
    def from_new_request(tokenizer: HFTokenizer | None, prompt_token_ids: list[int],
                         params: SamplingParams) -> IncrementalDetokenizer:
        if tokenizer is None or not params.detokenize:
            return IncrementalDetokenizer()
        return FastIncrementalDetokenizer(tokenizer, prompt_token_ids, params)


class FastIncrementalDetokenizer(IncrementalDetokenizer):
    def __init__(self, tokenizer: HFTokenizer, prompt_token_ids: list[int],
                 params: SamplingParams) -> None:
        super().__init__()
        self.tokenizer = tokenizer
        self.skip_special_tokens = params.skip_special_tokens
        self.stream = DecodeStream(ids=prompt_token_ids,
                                   skip_special_tokens=params.skip_special_tokens)
        self.stop = list(params.stop)
        self.min_tokens = params.min_tokens
        self.include_stop_str_in_output = params.include_stop_str_in_output
        self.stop_buffer_length = params.output_text_buffer_length
        self.output_text = ""
        self._last_output_text_offset = 0
        self.spaces_between_special_tokens = \
            params.skip_special_tokens or params.spaces_between_special_tokens
        self.added_token_ids: dict[int, str] = {}
        self.last_special = False
        if not self.spaces_between_special_tokens:
            self.added_token_ids = {i: t.content for i, t in
                                    tokenizer.get_added_tokens_decoder().items()}
            self.spaces_between_special_tokens = not self.added_token_ids

    def update(self, new_token_ids: list[int], stop_terminated: bool) -> str | None:
        """Detokenize new tokens; return the matched stop string, if any."""
        if not new_token_ids:
            return None
        skipped = None
        if stop_terminated and not self.include_stop_str_in_output:
            skipped, new_token_ids = new_token_ids[-1], new_token_ids[:-1]  # not shown
        num_prev_tokens = self.num_output_tokens()
        offsets = [len(self.output_text)]  # text length at each new token boundary
        for tok in new_token_ids:
            self.token_ids.append(tok)
            self.output_text += self.decode_next(tok)
            offsets.append(len(self.output_text))
        if skipped is not None:
            self.token_ids.append(skipped)
            offsets.append(len(self.output_text))
        if not self.stop or self.num_output_tokens() <= self.min_tokens:
            return None
        check_from = offsets[max(self.min_tokens - num_prev_tokens, 0)]
        hit = check_stop_strings(self.output_text, len(self.output_text) - check_from,
                                 self.stop, self.include_stop_str_in_output)
        if hit is None:
            return None
        stop_str, truncate_to = hit
        if truncate_to != -1:
            self.output_text = self.output_text[:truncate_to]
        return stop_str

    def decode_next(self, next_token_id: int) -> str:
        token = self._protected_step(next_token_id)
        if not self.spaces_between_special_tokens:
            special = self.added_token_ids.get(next_token_id)
            if special is not None and self.last_special:
                token = special  # the raw content, no space before it
            self.last_special = special is not None
        return token or ""

    def _protected_step(self, next_token_id: int) -> str | None:
        try:
            return self.stream.step(self.tokenizer, next_token_id)
        except (OverflowError, TypeError):
            logger.exception("Encountered invalid token id: %r", next_token_id)
            return None
        except Exception as e:
            if not str(e).startswith(INVALID_PREFIX_ERR_MSG):
                raise
            # non-monotonic UTF-8 output broke the stream's state: start a fresh one
            logger.warning("Encountered invalid prefix detokenization error, resetting "
                           "decode stream.")
            self.stream = DecodeStream(skip_special_tokens=self.skip_special_tokens)
            return self.stream.step(self.tokenizer, next_token_id)

    def get_next_output_text(self, finished: bool, delta: bool) -> str:
        buffer_length = 0 if finished else self.stop_buffer_length
        length = len(self.output_text) - buffer_length
        if not delta:
            return self.output_text[:max(length, 0)]
        last = self._last_output_text_offset
        if last < length:
            self._last_output_text_offset = length
            return self.output_text[last:length]
        return ""
