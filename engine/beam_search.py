"""Beam search over the engine: each step sends one request of one token per beam with
2 * beam_width logprobs and keeps the beam_width best continuations by cumulative
logprob; beams that end on an end-of-generation id (unless ignore_eos) join the completed
ones; at the end the best beam_width of all, ranked by the length-penalized score.

Mirrors vllm/entrypoints/generate/beam_search/online.py (BeamSearchOnlineMixin.beam_search),
vllm/entrypoints/generate/beam_search/utils.py (BeamSearchSequence, get_beam_search_score,
create_sort_beams_key_function, get_beam_search_eos_token_ids) and BeamSearchParams of
vllm/sampling_params.py. The engine is reached through `run_step`, so the front end
chooses how the step's requests are sent (engine/entrypoints/openai/serving_completion.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from libvllm.engine.logprobs import Logprob
from libvllm.engine.sampling_params import SamplingParams, verify_num_sequences

# run_step(token lists) -> per beam (finish_reason, {token id: Logprob} of its one new token)
RunStep = Callable[[list[list[int]], SamplingParams], list[tuple[str | None, dict | None]]]


@dataclass
class BeamSearchParams:
    """Beam search parameters for text generation (vLLM's BeamSearchParams)."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    # exponent on the generated-token count (a final EOS included) that normalizes a
    # beam's cumulative logprob when beams are ranked, as in Transformers
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        verify_num_sequences(self.beam_width, "beam_width")

    def step_sampling_params(self) -> SamplingParams:
        """What each step asks of the engine: one token with 2 x beam_width logprobs."""
        return SamplingParams(logprobs=2 * self.beam_width, max_tokens=1,
                              temperature=self.temperature, detokenize=False)


@dataclass
class BeamSearchSequence:
    """A beam: its tokens (prompt included), one logprobs dict per generated token."""

    tokens: list[int]
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


def get_beam_search_score(num_generated_tokens: int, cumulative_logprob: float,
                          length_penalty: float = 1.0) -> float:
    """Transformers' score: the length counts the generated tokens, a final EOS included."""
    return cumulative_logprob / (max(num_generated_tokens, 1) ** length_penalty)


def create_sort_beams_key_function(length_penalty: float) -> Callable[[BeamSearchSequence],
                                                                     tuple]:
    """A key in get_beam_search_score's order (higher is better) computed in logs, so that
    no length_penalty overflows: cum / n ** p = -exp(log(-cum) - p * log(n)) for cum < 0."""
    def sort_beams_key(x: BeamSearchSequence) -> tuple:
        # one logprobs entry per generated token, the EOS that `tokens` may omit included
        if x.cum_logprob >= 0:
            return (1, 0.0)
        n = max(len(x.logprobs), 1)
        return (0, length_penalty * math.log(n) - math.log(-x.cum_logprob))

    return sort_beams_key


def get_beam_search_eos_token_ids(generation_config: dict, eos_token_id: int | None
                                  ) -> set[int]:
    """The ids that end a beam: the tokenizer's EOS and generation_config's eos_token_id."""
    params = SamplingParams()
    params.update_from_generation_config(generation_config, eos_token_id)
    return set(params.all_stop_token_ids)


def beam_search(run_step: RunStep, prompt_token_ids: list[int], params: BeamSearchParams,
                eos_token_ids: set[int], decode: Callable[[list[int], bool], str] | None
                ) -> list[BeamSearchSequence]:
    """The best params.beam_width beams, best first; decode(ids, skip_special_tokens) gives
    each its text (None: no tokenizer, texts stay empty)."""
    step_params = params.step_sampling_params()
    sort_key = create_sort_beams_key_function(params.length_penalty)
    beams = [BeamSearchSequence(tokens=list(prompt_token_ids))]
    completed: list[BeamSearchSequence] = []
    for _ in range(params.max_tokens):
        results = run_step([b.tokens for b in beams], step_params)
        if any(reason == "abort" for reason, _ in results):
            for beam in beams:
                beam.finish_reason = "abort"
            break
        candidates = []  # (cumulative logprob, token id, beam, its step's logprobs)
        for beam, (_, logprobs) in zip(beams, results):
            for token_id, lp in (logprobs or {}).items():
                cum = beam.cum_logprob + lp.logprob
                if token_id in eos_token_ids and not params.ignore_eos:
                    completed.append(BeamSearchSequence(
                        tokens=beam.tokens + [token_id] if params.include_stop_str_in_output
                        else beam.tokens, logprobs=beam.logprobs + [logprobs],
                        cum_logprob=cum, finish_reason="stop", stop_reason=token_id))
                else:
                    candidates.append((cum, int(token_id), beam, logprobs))
        candidates.sort(key=lambda c: c[0], reverse=True)  # stable: ties keep their order
        beams = [BeamSearchSequence(tokens=b.tokens + [t], logprobs=b.logprobs + [lps],
                                    cum_logprob=cum)
                 for cum, t, b, lps in candidates[:params.beam_width]]
        if not beams:
            break
    best = sorted(completed + beams, key=sort_key, reverse=True)[:params.beam_width]
    prompt_len = len(prompt_token_ids)
    for beam in best:
        ends = beam.tokens[-1] in eos_token_ids and not params.ignore_eos
        generated = beam.tokens[prompt_len:-1] if ends else beam.tokens[prompt_len:]
        beam.text = "" if decode is None else decode(generated, params.skip_special_tokens)
        beam.finish_reason = beam.finish_reason or "length"
    return best
