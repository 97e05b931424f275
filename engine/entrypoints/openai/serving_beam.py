"""use_beam_search for the generation endpoints: a request's BeamSearchParams and the
search of each prompt through the engine, as final outputs the response builders take.

Mirrors vLLM's ChatCompletionRequest / CompletionRequest.to_beam_search_params and the
endpoints' use of BeamSearchOnlineMixin.beam_search (vllm/entrypoints/openai/
{completion,chat_completion}/serving.py): n beams a prompt, best first, choices numbered in
order, no streaming. The algorithm is engine/beam_search.py.
"""

from __future__ import annotations

import itertools
import math

from libvllm.engine.beam_search import BeamSearchParams, beam_search, get_beam_search_eos_token_ids
from libvllm.engine.entrypoints.openai.accumulate import FinalOutput, collect
from libvllm.engine.entrypoints.openai.errors import VLLMValidationError
from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.sampling_params import SamplingParams


def beam_search_params(req, structured_outputs, max_tokens: int, defaults: dict,
                       engine) -> BeamSearchParams:
    """to_beam_search_params of vLLM; what its beam search cannot honour is a 400 (vLLM:
    streaming, allowed_token_ids on the V1 runner; here also a grammar, which vLLM drops,
    and before any step what its first step would refuse or what would break the ranking)."""
    if req.stream:
        raise VLLMValidationError("Streaming is not currently supported with beam search",
                                  parameter="stream")
    if req.allowed_token_ids is not None:
        raise VLLMValidationError("Beam allowlists require the V2 model runner",
                                  parameter="allowed_token_ids")
    if structured_outputs is not None:
        raise VLLMValidationError("Structured outputs are not supported with beam search",
                                  parameter="structured_outputs")
    if max_tokens < 0:
        raise VLLMValidationError(f"max_tokens must be at least 0, got {max_tokens}.",
                                  parameter="max_tokens")
    if not math.isfinite(req.length_penalty):
        raise VLLMValidationError("length_penalty must be a finite number",
                                  parameter="length_penalty")
    temperature = req.temperature if req.temperature is not None \
        else defaults.get("temperature", SamplingParams.temperature)
    skip = req.skip_special_tokens if req.skip_special_tokens is not None \
        else defaults.get("skip_special_tokens", True)
    params = BeamSearchParams(
        beam_width=req.n if req.n is not None else 1, max_tokens=max_tokens,
        ignore_eos=bool(req.ignore_eos), temperature=temperature,
        length_penalty=req.length_penalty,
        include_stop_str_in_output=bool(req.include_stop_str_in_output),
        skip_special_tokens=skip)
    try:  # the engine's checks of every step's request, before the first one
        params.step_sampling_params().verify(engine.model_info.vocab_size,
                                             engine.config.max_logprobs)
    except InvalidArgumentError as e:
        raise VLLMValidationError(f"{e} (beam search asks 2 x n)", parameter="n") from e
    return params


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
    """Each prompt's beams, one prompt after the other, as choices numbered in that order
    (vLLM's index=len(choices): a prompt may end with fewer than n beams)."""
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
        sampling = {"logprobs": sp.logprobs, "max_tokens": sp.max_tokens,
                    "temperature": sp.temperature, "detokenize": sp.detokenize}
        steps.step = ctx.submit(f"{job_id}-beam{next(counter)}", token_lists,
                                [sampling] * len(token_lists), priority=priority,
                                cache_salt=cache_salt)
        if steps.cancelled:  # cancelled between the check and the submit
            steps.step.cancel()
        done = collect(steps.step)
        return [(done[i].finish_reason, (done[i].logprobs or [None])[0]) if i in done
                else ("abort", None) for i in range(len(token_lists))]

    finals = {}
    for p, (ids, bp) in enumerate(zip(prompts, params)):
        best = beam_search(run_step, ids, bp, eos, None if tok is None else decode)
        for beam in best:
            finals[len(finals)] = FinalOutput(
                p, ids, text=beam.text, token_ids=beam.tokens[len(ids):], logprobs=beam.logprobs,
                finish_reason=beam.finish_reason, stop_reason=beam.stop_reason)
    return finals
