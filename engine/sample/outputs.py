"""Sampler outputs: the sampler-side part of vllm/v1/outputs.py.

LogprobsTensors stay on the logits' device; LogprobsLists are their host copy, made once
per step at the end of ModelRunner.execute_model. The front end imports the lists only,
so torch is imported where tensors are joined (.agents/specs/torch-free-front-end.md).
Column 0 of every row is the sampled (or, for prompt logprobs, the actual next prompt)
token, then the top-k.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import torch


class LogprobsTensors(NamedTuple):
    logprob_token_ids: torch.Tensor  # [num_rows, num_logprobs + 1] int64
    logprobs: torch.Tensor  # [num_rows, num_logprobs + 1] fp32
    selected_token_ranks: torch.Tensor  # [num_rows] int64

    @staticmethod
    def cat(parts: list[LogprobsTensors]) -> LogprobsTensors:
        import torch

        return LogprobsTensors(*(torch.cat(t) for t in zip(*parts, strict=True)))

    def tolists(self, cu_num_generated_tokens: list[int] | None = None) -> LogprobsLists:
        return LogprobsLists(self.logprob_token_ids.tolist(), self.logprobs.tolist(),
                             self.selected_token_ranks.tolist(), cu_num_generated_tokens)


class LogprobsLists(NamedTuple):
    logprob_token_ids: list[list[int]]  # [num_rows][num_logprobs + 1]
    logprobs: list[list[float]]  # [num_rows][num_logprobs + 1]
    sampled_token_ranks: list[int]  # [num_rows]
    # request index in the batch -> its first row (requests may have 0 rows)
    cu_num_generated_tokens: list[int] | None = None

    def slice_request(self, req_idx: int, num_positions: int) -> LogprobsLists:
        start = req_idx if self.cu_num_generated_tokens is None \
            else self.cu_num_generated_tokens[req_idx]
        end = start + num_positions
        return LogprobsLists(self.logprob_token_ids[start:end], self.logprobs[start:end],
                             self.sampled_token_ranks[start:end])


class SamplerOutput(NamedTuple):
    sampled_token_ids: torch.Tensor  # [num_reqs] int64
    logprobs_tensors: LogprobsTensors | None  # None when no request asked for logprobs
