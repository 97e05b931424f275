"""RequestOutput / CompletionOutput returned by LLMEngine.step(), as vllm/outputs.py.
(What the engine core returns per request, EngineCoreOutput, is in
engine/engine_core/engine_core_messages.py.)

With RequestOutputKind.DELTA, `text`, `token_ids` and `logprobs` hold only what is new
since the previous output of that completion (what the C ABI streams). With n > 1 the
CompletionOutputs carry their index (0..n-1) within the request.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from libvllm.engine.logprobs import PromptLogprobs, SampleLogprobs


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None  # None unless logprobs were requested
    logprobs: SampleLogprobs | None = None  # one dict per token; None unless requested
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error" | "repetition" | None
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: PromptLogprobs | None = None  # first entry None; None unless requested
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    num_cached_tokens: int = 0
    error: Exception | None = None  # why a request finished with "error" (this one only)

    def add(self, next_output: RequestOutput, aggregate: bool) -> None:
        """Merge a later output of the same request (vLLM's RequestOutput.add): a
        completion with the same index is extended (aggregate, for deltas) or replaced."""
        self.finished |= next_output.finished
        self.error = self.error or next_output.error
        for nxt in next_output.outputs:
            for i, comp in enumerate(self.outputs):
                if comp.index != nxt.index:
                    continue
                if aggregate:
                    comp.text += nxt.text
                    comp.token_ids = [*comp.token_ids, *nxt.token_ids]
                    if nxt.logprobs:
                        comp.logprobs = [*(comp.logprobs or []), *nxt.logprobs]
                    comp.cumulative_logprob = nxt.cumulative_logprob
                    comp.finish_reason, comp.stop_reason = nxt.finish_reason, nxt.stop_reason
                else:
                    self.outputs[i] = nxt
                break
            else:
                self.outputs.append(nxt)


@dataclass
class PoolingOutput:
    """vllm/outputs.py PoolingOutput: the pooled data of one prompt (EmbeddingOutput's
    `embedding` is the same list for the embed task)."""

    data: list  # [dim] floats (embed) or [num_prompt_tokens][dim] (token_embed)

    @property
    def embedding(self) -> list:
        return self.data


@dataclass
class PoolingRequestOutput:
    """vllm/outputs.py PoolingRequestOutput: one output per request, once its prompt ran.
    outputs is None when the request was aborted before."""

    request_id: str
    outputs: PoolingOutput | None
    prompt_token_ids: list[int]
    num_cached_tokens: int = 0
    finished: bool = True
    error: Exception | None = None
