"""Scheduler helpers, as vllm/v1/core/sched/utils.py: check_stop (EOS, stop token ids,
length caps, repetition_detection) and remove_all."""

from __future__ import annotations

from collections.abc import Sequence

from libvllm.engine.request import Request, RequestStatus
from libvllm.engine.sampling_params import RepetitionDetectionParams


def remove_all(lst: list, items_to_remove: set) -> list:
    """`lst` without `items_to_remove` (in place for one item, else a new list)."""
    if len(items_to_remove) == 1:
        item = next(iter(items_to_remove))
        if item in lst:
            lst.remove(item)
        return lst
    return [item for item in lst if item not in items_to_remove] if items_to_remove else lst


def check_stop(request: Request, max_model_len: int) -> bool:
    """Set the finished status of a request whose last token ends it. Length caps apply
    even below min_tokens (the sampler keeps stop tokens out until min_tokens)."""
    sampling_params = request.sampling_params
    last_token_id = request.output_token_ids[-1]
    if not sampling_params.ignore_eos and last_token_id == request.eos_token_id:
        request.status = RequestStatus.FINISHED_STOPPED
        return True
    if last_token_id in (sampling_params.stop_token_ids or ()):
        request.status = RequestStatus.FINISHED_STOPPED
        request.stop_reason = last_token_id
        return True
    if request.num_tokens >= max_model_len or \
            request.num_output_tokens >= request.max_tokens:
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    if request.num_output_tokens < sampling_params.min_tokens:
        return False
    params = sampling_params.repetition_detection
    if params is not None and check_sequence_repetition(request.output_token_ids, params):
        request.status = RequestStatus.FINISHED_REPETITION
        request.stop_reason = "repetition_detected"
        return True
    return False


def check_sequence_repetition(token_ids: Sequence[int],
                              params: RepetitionDetectionParams) -> bool:
    """Whether the tail of token_ids is one n-gram (min..max_pattern_size long, the shortest
    first) repeated min_count times."""
    min_size = max(params.min_pattern_size, 1)
    if params.max_pattern_size <= 0 or params.min_count < 2 or \
            min_size > params.max_pattern_size:
        return False
    for size in range(min_size, params.max_pattern_size + 1):
        if size * params.min_count > len(token_ids):
            return False
        if _has_repeating_pattern(token_ids, size, params.min_count):
            return True
    return False


def _has_repeating_pattern(token_ids: Sequence[int], size: int, min_count: int) -> bool:
    """The last `size` tokens equal each of the min_count - 1 windows before them (the
    first difference ends the check, as upstream)."""
    for n in range(1, size + 1):
        target = token_ids[-n]
        for m in range(1, min_count):
            if token_ids[-(size * m + n)] != target:
                return False
    return True
