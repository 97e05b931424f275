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

S's last token may still be in flight (async scheduling: the step that samples it has not
returned), so the host reads K = S[:-1] only, as MRV2 reads the last token on the device:
for each row it lists the forced token for each last token that could change the answer
(one that completes a marker or continues the forced end) and for any other; the device
picks by the row's last input token. ThinkingScan keeps a request's marker positions so a
step scans only K's new tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from libvllm.engine.sample.ops.torch_utils import async_tensor_h2d, make_tensor_with_pad
from libvllm.engine.sampling_params import ReasoningTokenIds

FORCED_LOGIT = 1.0e9  # vLLM's value
NO_FORCE = -1


class ThinkingScan:
    """The last start / natural-end positions in a request's tokens[:scanned]."""

    __slots__ = ("scanned", "last_start", "last_end")

    def __init__(self) -> None:
        self.scanned = 0
        self.last_start = -1
        self.last_end = -1

    def update(self, tokens: list[int], n: int, start: list[int], end: list[int]) -> None:
        """Scan tokens[:n] added since the last call (and the markers they may complete)."""
        for i in range(max(0, self.scanned - max(len(start), len(end)) + 1), n):
            t = tokens[i]
            if t == start[0] and i + len(start) <= n and tokens[i:i + len(start)] == start:
                self.last_start = i
            if t == end[0] and i + len(end) <= n and tokens[i:i + len(end)] == end:
                self.last_end = i
        self.scanned = n


def forced_tokens(tokens: list[int], budget: int, ids: ReasoningTokenIds,
                  scan: ThinkingScan) -> tuple[dict[int, int], int]:
    """For S = tokens[:-1] + [t] (tokens' last entry unread: it may be in flight):
    ({t: forced token or NO_FORCE} for the t that matter, the forced token for any other
    t). Reads only the tail of tokens besides the scan's new part (no copy of S)."""
    start, end, natural_end = ids
    n = len(tokens)  # len(S)
    scan.update(tokens, n - 1, start, natural_end)

    def ends_with(prefix: list[int]) -> bool:  # S[:-1] ends with prefix
        return n - 1 >= len(prefix) and tokens[n - 1 - len(prefix):n - 1] == prefix

    def rule(t: int) -> int:
        def completes(marker: list[int]) -> bool:
            return t == marker[-1] and ends_with(marker[:-1])

        ls = n - len(start) if completes(start) else scan.last_start
        le = n - len(natural_end) if completes(natural_end) else scan.last_end
        if ls < 0 or ls <= le or n - (ls + len(start)) < budget:
            return NO_FORCE
        for p in range(min(len(end) - 1, n), 0, -1):
            if t == end[p - 1] and ends_with(end[:p - 1]):
                return end[p]
        return end[0]

    other = rule(-1)  # a token that completes no marker and continues no forced end
    return {t: rule(t) for t in {start[-1], natural_end[-1], *end[:-1]}}, other


@dataclass
class ThinkingBudgetTargets:
    """Per budget row: its row, candidate last tokens (-1-padded) with their forced tokens,
    and the forced token for any other last token (NO_FORCE: none)."""
    rows: torch.Tensor  # [B] int64
    candidates: torch.Tensor  # [B, C] int64, -1 padding
    forced: torch.Tensor  # [B, C] int64
    other: torch.Tensor  # [B] int64


def thinking_budget_targets(budgets: list[int | None], ids: list[ReasoningTokenIds | None],
                            token_ids: list[list[int]], scans: list[ThinkingScan],
                            device: torch.device) -> ThinkingBudgetTargets | None:
    """token_ids: each row's S (its last entry may be a placeholder, read on the device by
    apply_thinking_budget)."""
    rows, cands, forced, other = [], [], [], []
    for row, (budget, row_ids) in enumerate(zip(budgets, ids, strict=True)):
        if budget is None or row_ids is None:
            continue
        table, default = forced_tokens(token_ids[row], budget, row_ids, scans[row])
        rows.append(row)
        cands.append(list(table))
        forced.append(list(table.values()))
        other.append(default)
    if not rows:
        return None
    return ThinkingBudgetTargets(
        async_tensor_h2d(rows, torch.long, device), make_tensor_with_pad(cands, -1, device),
        make_tensor_with_pad(forced, NO_FORCE, device),
        async_tensor_h2d(other, torch.long, device))


def apply_thinking_budget(logits: torch.Tensor, tb: ThinkingBudgetTargets,
                          last_token_ids: torch.Tensor) -> torch.Tensor:
    """logits: [num_reqs, vocab] fp32, in place; last_token_ids: [num_reqs] each row's S[-1]
    on the device. No host sync."""
    last = last_token_ids[tb.rows].unsqueeze(1)  # [B, 1]
    match = tb.candidates == last  # [B, C]: at most one per row
    picked = tb.forced.gather(1, match.int().argmax(1, keepdim=True)).squeeze(1)
    token = torch.where(match.any(1), picked, tb.other)  # [B]
    index = token.clamp(min=0)
    logits[tb.rows, index] = torch.where(token >= 0, FORCED_LOGIT, logits[tb.rows, index])
    return logits
