"""OutputProcessor: engine-core results -> RequestOutput objects, as
vllm/v1/engine/output_processor.py.

Owns one RequestState per live (child) request: detokenizer, logprobs processor,
output-kind bookkeeping, and its ParentRequest when the user asked for n > 1. It
reports requests that a stop string finished so the engine aborts them in the core.
One RequestOutput per user request per step: outputs of children of one parent in the
same step are merged (what vLLM's AsyncLLM output collector does). It runs in the front
end: it sees the core's requests only as EngineCoreRequests and EngineCoreOutputs.
"""

from __future__ import annotations

from tokenizers import Tokenizer as HFTokenizer

from libvllm.engine.detokenizer import IncrementalDetokenizer
from libvllm.engine.engine_core.engine_core_messages import (
    EngineCoreOutput,
    EngineCoreRequest,
    error_from_wire,
)
from libvllm.engine.logprobs_processor import LogprobsProcessor
from libvllm.engine.outputs import CompletionOutput, RequestOutput
from libvllm.engine.parallel_sampling import ParentRequest
from libvllm.engine.sampling_params import RequestOutputKind


class RequestState:
    def __init__(self, request: EngineCoreRequest, prompt: str | None, tokenizer: HFTokenizer,
                 parent_req: ParentRequest | None, request_index: int) -> None:
        sp = request.sampling_params
        self.request_id = request.request_id
        self.parent_req = parent_req
        self.request_index = request_index
        self.prompt = prompt
        self.prompt_token_ids = request.prompt_token_ids
        self.output_kind = sp.output_kind
        tokenizer = tokenizer if sp.detokenize else None
        self.detokenizer = IncrementalDetokenizer.from_new_request(
            tokenizer, request.prompt_token_ids, sp)
        self.logprobs_processor = LogprobsProcessor(tokenizer, sp.num_logprobs, sp.prompt_logprobs)
        self.sent_tokens = 0
        # DELTA outputs every stream_interval new tokens, the first and the last at once
        # (vLLM clamps it up to the engine's --stream-interval, whose default 1 runs here)
        self.stream_interval = sp.stream_interval or 1
        self.num_cached_tokens = 0  # the core's prefix-cache hit length, once scheduled

    @property
    def external_req_id(self) -> str:
        return self.request_id if self.parent_req is None else self.parent_req.request_id

    def make_request_output(self, finish_reason: str | None, stop_reason,
                            num_cached: int) -> RequestOutput | None:
        finished = finish_reason is not None
        if self.output_kind == RequestOutputKind.FINAL_ONLY and not finished:
            return None
        if self.output_kind == RequestOutputKind.DELTA and not finished and self.sent_tokens \
                and len(self.detokenizer.output_token_ids) - self.sent_tokens \
                < self.stream_interval:
            return None
        completion = self._new_completion_output(finish_reason, stop_reason)
        if self.output_kind == RequestOutputKind.DELTA and not finished \
                and not completion.text and not completion.token_ids:
            return None
        outputs = [completion]
        if self.parent_req is not None:
            outputs, finished = self.parent_req.get_outputs(self.request_id, completion)
            if not outputs:
                return None
        lp = self.logprobs_processor
        prompt_logprobs = lp.pop_prompt_logprobs() \
            if self.output_kind == RequestOutputKind.DELTA else lp.prompt_logprobs
        return RequestOutput(self.external_req_id, self.prompt, self.prompt_token_ids,
                             prompt_logprobs, list(outputs), finished, max(num_cached, 0))

    def _new_completion_output(self, finish_reason: str | None, stop_reason) -> CompletionOutput:
        finished = finish_reason is not None
        delta = self.output_kind == RequestOutputKind.DELTA
        text = self.detokenizer.get_next_output_text(finished, delta)
        all_ids = self.detokenizer.output_token_ids
        ids = all_ids[self.sent_tokens:] if delta else list(all_ids)
        logprobs = self.logprobs_processor.logprobs
        if delta and logprobs is not None:
            logprobs = logprobs[self.sent_tokens:]
        elif logprobs is not None:
            logprobs = list(logprobs)
        self.sent_tokens = len(all_ids)
        return CompletionOutput(self.request_index, text, ids,
                                self.logprobs_processor.cumulative_logprob, logprobs,
                                finish_reason, stop_reason if finished else None)


class OutputProcessor:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.request_states: dict[str, RequestState] = {}
        self.parent_requests: dict[str, ParentRequest] = {}

    def has_request(self, request_id: str) -> bool:
        return request_id in self.request_states or request_id in self.parent_requests

    def add_request(self, request: EngineCoreRequest, prompt: str | None,
                    parent_req: ParentRequest | None = None, request_index: int = 0) -> None:
        self.request_states[request.request_id] = RequestState(
            request, prompt, self.tokenizer and self.tokenizer.backend, parent_req,
            request_index)
        if parent_req is not None:
            self.parent_requests[parent_req.request_id] = parent_req

    def child_request_ids(self, request_id: str) -> list[str]:
        """The live engine requests behind a user request id (itself, or its children)."""
        parent = self.parent_requests.get(request_id)
        if parent is None:
            return [request_id] if request_id in self.request_states else []
        return sorted(parent.child_requests)

    def has_unfinished_requests(self) -> bool:
        return bool(self.request_states)

    def process_outputs(self, engine_core_outputs: list[EngineCoreOutput]
                        ) -> tuple[list[RequestOutput], list[str]]:
        """Returns (outputs, ids of requests a stop string finished: the caller aborts
        them in the core). Outputs of requests no longer here (aborted) are dropped."""
        outputs, stopped = [], []
        for out in engine_core_outputs:
            state = self.request_states.get(out.request_id)
            if state is None:
                continue
            finish_reason, stop_reason = out.finish_reason, out.stop_reason
            stop_str = state.detokenizer.update(out.new_token_ids, finish_reason == "stop")
            if stop_str is not None:  # also over the engine's own reason (vLLM)
                if finish_reason is None:
                    stopped.append(out.request_id)
                finish_reason, stop_reason = "stop", stop_str
            state.logprobs_processor.update_from_output(out.new_logprobs,
                                                        out.new_prompt_logprobs)
            if out.num_cached_tokens >= 0:
                state.num_cached_tokens = out.num_cached_tokens
            result = state.make_request_output(finish_reason, stop_reason,
                                               state.num_cached_tokens)
            if result is not None and out.error is not None:
                result.error = error_from_wire(out.error)
            if finish_reason is not None:
                self._finish_request(state)
            if result is not None:
                outputs.append(result)
        return _merge_by_request(outputs), stopped

    def abort_requests(self, request_ids: list[str]) -> list[RequestOutput]:
        """The last outputs (finish reason "abort") of live requests; others skipped."""
        outputs = []
        for request_id in request_ids:
            state = self.request_states.get(request_id)
            if state is None:
                continue
            out = state.make_request_output("abort", None, state.num_cached_tokens)
            self._finish_request(state)
            if out is not None:
                outputs.append(out)
        return _merge_by_request(outputs)

    def _finish_request(self, state: RequestState) -> None:
        del self.request_states[state.request_id]
        parent = state.parent_req
        if parent is not None and not parent.child_requests:
            self.parent_requests.pop(parent.request_id, None)


def _merge_by_request(outputs: list[RequestOutput]) -> list[RequestOutput]:
    merged: dict[str, RequestOutput] = {}
    for out in outputs:
        if out.request_id not in merged:
            merged[out.request_id] = out
        else:  # children of one parent: completions are distinct by index
            merged[out.request_id].add(out, aggregate=False)
    return list(merged.values())
