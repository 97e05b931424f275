"""thinking_token_budget: end a reasoning block after its budget of tokens, as vLLM 0.33's
Model Runner V2 (vllm/v1/worker/gpu/sample/thinking_budget.py, ThinkingBudgetState).

Per sampled row with a budget B, over S = prompt + output so far and the engine's
reasoning markers (start, forced end, natural end; engine/reasoning/config.py): let ls /
le be the last positions of the start / natural-end sequences in S. Inside a block
(ls > le) with at least B tokens after the start, the next token of the forced end
sequence gets logit 1e9, after every other logits stage; the sequence goes out one token a
step, continuing a partial one at S's tail (p = the longest proper prefix of it that S
ends with). A natural end closes the block; a later start opens a new one with a fresh
budget. Prompt tokens count: a prompt that ends inside a block has spent part of it.

S is known whole on the host (budget rows read their outputs, as penalties do:
engine/sample/metadata.py reads_output_token_ids, so the engine resolves in-flight tokens
first), so the host picks each row's forced token and the device gets one index_put.
ThinkingScan keeps a request's marker positions so a step scans only its new tokens.
"""

from __future__ import annotations

import torch

from engine.sample.ops.torch_utils import async_tensor_h2d

FORCED_LOGIT = 1.0e9  # vLLM's value


class ThinkingScan:
    """The last start / natural-end positions in a request's tokens[:scanned]."""

    __slots__ = ("scanned", "last_start", "last_end")

    def __init__(self) -> None:
        self.scanned = 0
        self.last_start = -1
        self.last_end = -1

    def update(self, tokens: list[int], start: list[int], end: list[int]) -> None:
        """Scan what was added since the last call (and the markers it may complete)."""
        n = len(tokens)
        for i in range(max(0, self.scanned - max(len(start), len(end)) + 1), n):
            t = tokens[i]
            if t == start[0] and tokens[i:i + len(start)] == start:
                self.last_start = i
            if t == end[0] and tokens[i:i + len(end)] == end:
                self.last_end = i
        self.scanned = n


def forced_token(tokens: list[int], budget: int,
                 ids: tuple[list[int], list[int], list[int]],
                 scan: ThinkingScan) -> int | None:
    """The token the next step must take, or None. ids: (start, forced end, natural end)."""
    start, end, natural_end = ids
    scan.update(tokens, start, natural_end)
    if scan.last_start < 0 or scan.last_start <= scan.last_end:
        return None
    if len(tokens) - (scan.last_start + len(start)) < budget:
        return None
    for p in range(min(len(end) - 1, len(tokens)), 0, -1):
        if tokens[-p:] == end[:p]:
            return end[p]
    return end[0]


def thinking_budget_targets(budgets: list[int | None],
                            ids: list[tuple[list[int], list[int], list[int]] | None],
                            token_ids: list[list[int]], scans: list[ThinkingScan],
                            device: torch.device) -> torch.Tensor | None:
    """[2, num_forced] int64 (rows, token ids) of the rows that must take a forced token;
    None when none must."""
    rows, tokens = [], []
    for row, (budget, row_ids) in enumerate(zip(budgets, ids, strict=True)):
        if budget is None or row_ids is None:
            continue
        token = forced_token(token_ids[row], budget, row_ids, scans[row])
        if token is not None:
            rows.append(row)
            tokens.append(token)
    return async_tensor_h2d([rows, tokens], torch.long, device) if rows else None


def apply_thinking_budget(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """logits: [num_reqs, vocab] fp32, in place; targets from thinking_budget_targets."""
    logits.index_put_((targets[0], targets[1]), logits.new_full((), FORCED_LOGIT))
    return logits
