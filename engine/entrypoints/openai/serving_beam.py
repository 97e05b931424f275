"""use_beam_search for the generation endpoints: a request's BeamSearchParams and the
search of each prompt through the engine, as final outputs the response builders take.

Mirrors vLLM's ChatCompletionRequest / CompletionRequest.to_beam_search_params and the
endpoints' use of BeamSearchOnlineMixin.beam_search (vllm/entrypoints/openai/
{completion,chat_completion}/serving.py): n beams a prompt, choice index prompt_idx * n + i,
best first, no streaming. The algorithm is engine/beam_search.py.
"""

from __future__ import annotations

import itertools

from engine.beam_search import BeamSearchParams, beam_search, get_beam_search_eos_token_ids
from engine.entrypoints.openai.accumulate import FinalOutput, collect
from engine.entrypoints.openai.errors import VLLMValidationError
from engine.sampling_params import SamplingParams


def beam_search_params(req, structured_outputs, max_tokens: int, defaults: dict
                       ) -> BeamSearchParams:
    """to_beam_search_params of vLLM; what its beam search cannot honour is a 400 (vLLM:
    streaming, allowed_token_ids on the V1 runner; here also a grammar, which vLLM drops)."""
    if req.stream:
        raise VLLMValidationError("Streaming is not currently supported with beam search",
                                  parameter="stream")
    if req.allowed_token_ids is not None:
        raise VLLMValidationError("Beam allowlists require the V2 model runner",
                                  parameter="allowed_token_ids")
    if structured_outputs is not None:
        raise VLLMValidationError("Structured outputs are not supported with beam search",
                                  parameter="structured_outputs")
    temperature = req.temperature if req.temperature is not None \
        else defaults.get("temperature", 1.0)
    skip = req.skip_special_tokens if req.skip_special_tokens is not None \
        else defaults.get("skip_special_tokens", True)
    return BeamSearchParams(
        beam_width=req.n if req.n is not None else 1, max_tokens=max_tokens,
        ignore_eos=bool(req.ignore_eos), temperature=temperature,
        length_penalty=req.length_penalty,
        include_stop_str_in_output=bool(req.include_stop_str_in_output),
        skip_special_tokens=skip)


class BeamSteps:
    """What the API layer cancels and closes for a beam search (a MergedStream's role):
    the requests of the step in flight, and every later step."""

    def __init__(self) -> None:
        self.step = None  # the MergedStream of the step in flight
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
        if self.step is not None:
            self.step.cancel()

    def close(self) -> None:
        self.cancel()
        if self.step is not None:
            self.step.close()


def beam_finals(ctx, job_id: str, prompts: list[list[int]], params: list[BeamSearchParams],
                steps: BeamSteps, priority: int, cache_salt: str | None
                ) -> dict[int, FinalOutput]:
    """Each prompt's beams, one prompt after the other, as choices prompt_idx * n + i."""
    engine, lock = ctx.client.engine, ctx.client.lock
    processor = engine.input_processor
    eos = get_beam_search_eos_token_ids(processor.generation_config, processor.eos_token_id)
    tok, counter = engine.tokenizer, itertools.count()

    def decode(ids: list[int], skip: bool) -> str:
        with lock:
            return tok.decode(ids, skip_special_tokens=skip)

    def run_step(token_lists: list[list[int]], sp: SamplingParams):
        if steps.cancelled:  # the caller went away: vLLM's abort
            return [("abort", None)] * len(token_lists)
        sampling = {"logprobs": sp.logprobs, "max_tokens": 1, "temperature": sp.temperature,
                    "detokenize": False}
        steps.step = ctx.submit(f"{job_id}-beam{next(counter)}", token_lists,
                                [sampling] * len(token_lists), priority=priority,
                                cache_salt=cache_salt)
        done = collect(steps.step)
        return [(done[i].finish_reason, (done[i].logprobs or [None])[0]) if i in done
                else ("abort", None) for i in range(len(token_lists))]

    finals = {}
    for p, (ids, bp) in enumerate(zip(prompts, params)):
        best = beam_search(run_step, ids, bp, eos, None if tok is None else decode)
        for i, beam in enumerate(best):
            finals[p * bp.beam_width + i] = FinalOutput(
                p, ids, text=beam.text, token_ids=beam.tokens[len(ids):], logprobs=beam.logprobs,
                finish_reason=beam.finish_reason, stop_reason=beam.stop_reason)
    return finals
