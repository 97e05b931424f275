"""capi.typed_outputs: the per-sequence parts of vllm_request_output and vllm_event
(since ABI 1.0): the sequence index (n > 1), typed logprobs and per-request timings.

Logprobs come from CompletionOutput.logprobs (vllm/logprobs.py: per generated token a
dict token id -> Logprob(logprob, rank), the sampled token and the top-k with ranks
1..k) as vllm_token_logprobs: the sampled token's logprob and rank, then the top k by
rank, or with logprob_token_ids those ids in their order (rank = position). Timings are
the engine session's (engine/session/request_times.py, vLLM's RequestStateStats names):
arrival_time (Unix s, when the request was added), first_token_latency and e2e_latency
(s from arrival).
"""

from __future__ import annotations

from _libvllm import ffi

from libvllm.engine.session import RequestTimes


def fill(out, completion, first_token_latency: float, times: RequestTimes, finished: bool,
         memory: list) -> None:
    """Sets index, logprobs and timings of a vllm_request_output / vllm_event."""
    out.index = completion.index
    out.arrival_time = times.arrival_time
    out.first_token_latency = first_token_latency
    out.e2e_latency = times.e2e_latency() if finished else 0.0
    out.logprobs = ffi.NULL
    if completion.logprobs is not None and completion.token_ids:
        out.logprobs = _logprobs(completion, times.top_k, times.top_ids, memory)


def _logprobs(completion, top_k: int, top_ids: list[int] | None, memory: list):
    """vllm_token_logprobs[len(token_ids)] of a completion; top_k = the params' logprobs;
    top_ids: logprob_token_ids (their entries, whatever the sampled token's rank)."""
    array = ffi.new("vllm_token_logprobs[]", len(completion.token_ids))
    memory.append(array)
    for entry, token, position in zip(array, completion.token_ids, completion.logprobs):
        sampled = position[token]
        entry.token_id, entry.rank, entry.logprob = token, sampled.rank or 0, sampled.logprob
        if top_ids is not None:
            top = [(i + 1, t, position[t].logprob) for i, t in enumerate(top_ids)]
        else:
            top = sorted(((lp.rank, tid, lp.logprob) for tid, lp in position.items()
                          if lp.rank is not None and lp.rank <= top_k))[:top_k]
        if top:  # keep the owner: reading entry.top back gives a pointer that owns nothing
            owner = ffi.new("vllm_logprob[]", [(tid, rank, lp) for rank, tid, lp in top])
            memory.append(owner)
            entry.top, entry.n_top = owner, len(top)
    return array
