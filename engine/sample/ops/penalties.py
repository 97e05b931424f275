"""Presence, frequency and repetition penalties, as vllm/v1/sample/ops/penalties.py and
vllm/model_executor/layers/utils.py::apply_penalties.

Token occurrences are counted per row by one scatter_add into a [num_reqs, vocab + 1]
bin count (column `vocab` absorbs the padding), so there is no Python loop over the
vocabulary. OpenAI definitions: frequency subtracts f * count(output), presence
subtracts p * [in output]; repetition (CTRL) divides positive logits by r and
multiplies negative ones by r for tokens in the prompt or the output.
"""

from __future__ import annotations

import torch

from libvllm.engine.sample.ops.torch_utils import make_tensor_with_pad

IN_FLIGHT = -1  # a token the step in flight samples (the model runner's placeholder)


def get_token_bin_counts_and_mask(tokens: torch.Tensor, vocab_size: int,
                                  num_seqs: int) -> tuple[torch.Tensor, torch.Tensor]:
    # tokens: [num_seqs, max_len] int64, padded with vocab_size
    bin_counts = torch.zeros((num_seqs, vocab_size + 1), dtype=torch.long, device=tokens.device)
    bin_counts.scatter_add_(1, tokens, torch.ones_like(tokens))
    bin_counts = bin_counts[:, :vocab_size]  # [num_seqs, vocab]
    return bin_counts, bin_counts > 0


def apply_penalties(logits: torch.Tensor, prompt_tokens: torch.Tensor,
                    output_tokens: torch.Tensor, presence_penalties: torch.Tensor,
                    frequency_penalties: torch.Tensor,
                    repetition_penalties: torch.Tensor) -> torch.Tensor:
    """In place on logits [num_seqs, vocab]; token tensors padded with vocab."""
    num_seqs, vocab_size = logits.shape
    _, prompt_mask = get_token_bin_counts_and_mask(prompt_tokens, vocab_size, num_seqs)
    output_bin_counts, output_mask = get_token_bin_counts_and_mask(
        output_tokens, vocab_size, num_seqs)
    penalties = torch.where(prompt_mask | output_mask, repetition_penalties.unsqueeze(1), 1.0)
    logits *= torch.where(logits > 0, 1.0 / penalties, penalties)
    logits -= frequency_penalties.unsqueeze(1) * output_bin_counts
    logits -= presence_penalties.unsqueeze(1) * output_mask
    return logits


def apply_all_penalties(logits: torch.Tensor, prompt_token_ids: torch.Tensor,
                        presence_penalties: torch.Tensor, frequency_penalties: torch.Tensor,
                        repetition_penalties: torch.Tensor, output_token_ids: list[list[int]],
                        last_token_ids: torch.Tensor | None = None) -> torch.Tensor:
    """output_token_ids: each row's outputs so far, the last one -1 while in flight (async
    scheduling); last_token_ids: [num_reqs] each row's last token on the device, which
    takes the -1's place (vLLM's MRV2 counts the in-flight token on the device)."""
    vocab_size = logits.shape[1]
    output_tokens = make_tensor_with_pad(output_token_ids, vocab_size, logits.device)
    if last_token_ids is not None:
        output_tokens = torch.where(output_tokens == IN_FLIGHT, last_token_ids.unsqueeze(1),
                                    output_tokens)
    return apply_penalties(logits, prompt_token_ids, output_tokens, presence_penalties,
                           frequency_penalties, repetition_penalties)

