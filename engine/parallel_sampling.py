"""ParentRequest: fan-out of a request with n > 1, as vllm/v1/engine/parallel_sampling.py.

The engine runs n child requests `{i}_{parent_id}` (n = 1 each); a seeded parent gives
child i the seed `seed + i`, an unseeded one shares one params object among its
children. get_outputs folds each child's CompletionOutput (index i) back into the
parent: streamed as they come (CUMULATIVE / DELTA), or all n at once when the last
child finishes (FINAL_ONLY). The parent is finished when every child is.
"""

from __future__ import annotations

from copy import copy

from libvllm.engine.outputs import CompletionOutput
from libvllm.engine.sampling_params import RequestOutputKind, SamplingParams


class ParentRequest:
    def __init__(self, request_id: str, sampling_params: SamplingParams) -> None:
        self.request_id = request_id
        self.sampling_params = sampling_params
        self.child_requests: set[str] = set()  # children not finished yet
        final_only = sampling_params.output_kind == RequestOutputKind.FINAL_ONLY
        self.output_aggregator: list[CompletionOutput | None] = \
            [None] * sampling_params.n if final_only else []
        self.cached_child_sampling_params: SamplingParams | None = None

    @property
    def n(self) -> int:
        return self.sampling_params.n

    def _get_child_sampling_params(self, index: int) -> SamplingParams:
        if self.cached_child_sampling_params is not None:
            return self.cached_child_sampling_params
        child = copy(self.sampling_params)
        child.n = 1
        if self.sampling_params.seed is None:
            self.cached_child_sampling_params = child
        else:
            child.seed = self.sampling_params.seed + index
        return child

    def get_child_info(self, index: int) -> tuple[str, SamplingParams]:
        child_req_id = f"{index}_{self.request_id}"
        self.child_requests.add(child_req_id)
        return child_req_id, self._get_child_sampling_params(index)

    def get_outputs(self, child_request_id: str,
                    completion_output: CompletionOutput) -> tuple[list[CompletionOutput], bool]:
        """(outputs to return now, whether the parent is finished)."""
        already_returned = False
        if completion_output.finished():
            if child_request_id in self.child_requests:
                self.child_requests.remove(child_request_id)
            else:
                already_returned = True
        if self.sampling_params.output_kind != RequestOutputKind.FINAL_ONLY:
            outputs = [] if already_returned else [completion_output]
        else:
            self.output_aggregator[completion_output.index] = completion_output
            outputs = [] if self.child_requests else self.output_aggregator
        return outputs, not self.child_requests
