"""Bad words, as vllm/v1/sample/ops/bad_words.py: a word (a token id sequence) bans its
last token when the request's output so far ends with the word's other tokens. The
loop is over each request's bad words (at most 128), never the vocabulary; all bans
land with one indexed write.
"""

from __future__ import annotations

import torch

from libvllm.engine.sample.ops.torch_utils import async_tensor_h2d


def apply_bad_words(logits: torch.Tensor, bad_words_token_ids: dict[int, list[list[int]]],
                    past_tokens_ids: list[list[int]]) -> None:
    # logits: [num_reqs, vocab], modified in place
    rows: list[int] = []
    cols: list[int] = []
    for i, words in bad_words_token_ids.items():
        past = past_tokens_ids[i]
        for word in words:
            prefix_length = len(word) - 1
            if prefix_length > len(past):
                continue
            if prefix_length == 0 or past[-prefix_length:] == word[:-1]:
                rows.append(i)
                cols.append(word[-1])
    if rows:
        index = async_tensor_h2d([rows, cols], torch.long, logits.device)
        # a device scalar: a Python one would be copied from pageable memory (a host sync)
        logits.index_put_((index[0], index[1]), logits.new_full((), -float("inf")))
