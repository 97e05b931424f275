"""IncrementalDetokenizer: token ids -> text as they arrive, plus stop strings.

Mirrors vllm/v1/engine/detokenizer.py (FastIncrementalDetokenizer): the `tokenizers`
DecodeStream primed with the prompt emits text only once a token completes valid
UTF-8, so no broken characters are ever streamed. Stop strings are searched in the
new text only; when they are excluded from the output, the last len(stop)-1 chars
are held back while streaming.
"""

from __future__ import annotations

import sys

from tokenizers import Tokenizer as HFTokenizer
from tokenizers.decoders import DecodeStream

from engine.sampling_params import SamplingParams


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
        end = best_idx + len(best)
        return best, (-1 if end >= len(output_text) else end)
    return best, best_idx


class IncrementalDetokenizer:
    def __init__(self, tokenizer: HFTokenizer, prompt_token_ids: list[int],
                 params: SamplingParams) -> None:
        self.tokenizer = tokenizer
        self.stream = DecodeStream(ids=prompt_token_ids,
                                   skip_special_tokens=params.skip_special_tokens)
        self.stop = list(params.stop)
        self.min_tokens = params.min_tokens
        self.include_stop_str_in_output = params.include_stop_str_in_output
        hold = self.stop and not self.include_stop_str_in_output
        self.stop_buffer_length = max(map(len, self.stop)) - 1 if hold else 0
        self.output_text = ""
        self.num_tokens = 0
        self._last_output_text_offset = 0

    def update(self, new_token_ids: list[int], stop_terminated: bool) -> str | None:
        """Detokenize new tokens; return the matched stop string, if any."""
        if stop_terminated and not self.include_stop_str_in_output:
            new_token_ids = new_token_ids[:-1]  # the stop/eos token is not shown
            self.num_tokens += 1
        start = len(self.output_text)
        for tok in new_token_ids:
            self.output_text += self.stream.step(self.tokenizer, tok) or ""
            self.num_tokens += 1
        if not self.stop or self.num_tokens <= self.min_tokens:
            return None
        hit = check_stop_strings(self.output_text, len(self.output_text) - start, self.stop,
                                 self.include_stop_str_in_output)
        if hit is None:
            return None
        stop_str, truncate_to = hit
        if truncate_to != -1:
            self.output_text = self.output_text[:truncate_to]
        return stop_str

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
