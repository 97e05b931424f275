"""OutputProcessor: engine-core results -> RequestOutput objects, as
vllm/v1/engine/output_processor.py.

Owns one RequestState per live request (detokenizer, output kind bookkeeping) and
reports requests that a stop string finished so the engine aborts them in the core.
"""

from __future__ import annotations

from engine.detokenizer import IncrementalDetokenizer
from engine.outputs import CompletionOutput, RequestOutput
from engine.request import Request
from engine.sampling_params import RequestOutputKind


class RequestState:
    def __init__(self, request: Request, prompt: str | None, detokenizer: IncrementalDetokenizer):
        self.request_id = request.request_id
        self.prompt = prompt
        self.prompt_token_ids = request.prompt_token_ids
        self.output_kind = request.sampling_params.output_kind
        self.detokenizer = detokenizer
        self.token_ids: list[int] = []
        self.sent_tokens = 0

    def make_output(self, finish_reason: str | None, stop_reason, num_cached: int):
        finished = finish_reason is not None
        if self.output_kind == RequestOutputKind.FINAL_ONLY and not finished:
            return None
        delta = self.output_kind == RequestOutputKind.DELTA
        text = self.detokenizer.get_next_output_text(finished, delta)
        ids = self.token_ids[self.sent_tokens:] if delta else list(self.token_ids)
        self.sent_tokens = len(self.token_ids)
        if delta and not text and not ids and not finished:
            return None
        comp = CompletionOutput(0, text, ids, finish_reason, stop_reason)
        return RequestOutput(self.request_id, self.prompt, self.prompt_token_ids, [comp],
                             finished, max(num_cached, 0))


class OutputProcessor:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.request_states: dict[str, RequestState] = {}

    def add_request(self, request: Request, prompt: str | None) -> None:
        detok = IncrementalDetokenizer(self.tokenizer.backend, request.prompt_token_ids,
                                       request.sampling_params)
        self.request_states[request.request_id] = RequestState(request, prompt, detok)

    def process_outputs(self, results: list[tuple[Request, list[int]]]
                        ) -> tuple[list[RequestOutput], list[str]]:
        """Returns (outputs, ids of requests a stop string finished)."""
        outputs, stopped = [], []
        for req, new_ids in results:
            state = self.request_states.get(req.request_id)
            if state is None:
                continue
            finish_reason = req.get_finished_reason()
            stop_reason = req.stop_reason
            stop_str = state.detokenizer.update(new_ids, finish_reason == "stop")
            state.token_ids.extend(new_ids)
            if stop_str is not None and finish_reason is None:
                finish_reason, stop_reason = "stop", stop_str
                stopped.append(req.request_id)
            out = state.make_output(finish_reason, stop_reason, req.num_cached_tokens)
            if finish_reason is not None:
                del self.request_states[req.request_id]
            if out is not None:
                outputs.append(out)
        return outputs, stopped

    def abort_requests(self, requests: list[Request]) -> list[RequestOutput]:
        outputs = []
        for req in requests:
            state = self.request_states.pop(req.request_id, None)
            if state is not None:
                out = state.make_output("abort", None, req.num_cached_tokens)
                if out is not None:
                    outputs.append(out)
        return outputs
