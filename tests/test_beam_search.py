"""Beam search (engine/beam_search.py) and the completions endpoint's use_beam_search.

Ports vLLM 0.33 tests/samplers/test_beam_search.py: test_beam_search_single_input (the
beams equal Transformers' generate(num_beams=k, num_return_sequences=k) token for token;
here HF transformers fp32 on the test GGUF, the repository's oracle, against the CPU
engine) and the abort case of
test_beam_search_abort_returns_partial_outputs_and_continues_other_prompts (a fake
engine step). The endpoint's refusals are vLLM's (streaming, allowed_token_ids on the V1
runner) plus a grammar, which vLLM's completions would drop silently.
"""

from __future__ import annotations

import pytest
from test_openai_api import Spy, call, client, err, ok  # noqa: F401 - client: the fixture

from libvllm.engine.beam_search import (
    BeamSearchParams,
    beam_search,
    get_beam_search_eos_token_ids,
    get_beam_search_score,
)
from libvllm.engine.entrypoints.openai.serving_beam import BeamSteps
from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.logprobs import Logprob


def _fake_step(table):
    """run_step over a table {last token: {next token: logprob}}; token 99 aborts."""
    def run_step(token_lists, sp):
        assert sp.max_tokens == 1 and sp.logprobs == 4 and not sp.detokenize
        out = []
        for tokens in token_lists:
            if tokens[-1] == 99:
                out.append(("abort", None))
            else:
                out.append(("length", {t: Logprob(lp) for t, lp in table[tokens[-1]].items()}))
        return out
    return run_step


def test_beams_keep_the_best_continuations_and_rank_by_length_penalty():
    # from 1: 2 (-0.1) or eos 0 (-0.3); from 2: 3 (-0.3) or 4 (-2.0); 3 and 4 go on to 5
    table = {1: {2: -0.1, 0: -0.3}, 2: {3: -0.3, 4: -2.0}, 3: {5: -0.3}, 4: {5: -0.1},
             5: {5: -0.1}}
    best = beam_search(_fake_step(table), [1], BeamSearchParams(beam_width=2, max_tokens=3),
                       {0}, lambda ids, skip: " ".join(map(str, ids)))
    # length penalty 1: [1, 2, 3, 5] -0.7 / 3 beats the completed [1] (+eos) -0.3 / 1
    assert [b.tokens for b in best] == [[1, 2, 3, 5], [1]]
    assert [b.finish_reason for b in best] == ["length", "stop"]
    assert best[1].stop_reason == 0 and best[1].text == "" and best[0].text == "2 3 5"
    assert best[0].cum_logprob == pytest.approx(-0.7) and len(best[0].logprobs) == 3
    # length penalty 0 ranks by the cumulative logprob alone: the eos beam first, its eos
    # kept with include_stop_str_in_output
    best = beam_search(_fake_step(table), [1], BeamSearchParams(
        beam_width=2, max_tokens=3, length_penalty=0.0, include_stop_str_in_output=True),
        {0}, None)
    assert [b.tokens for b in best] == [[1, 0], [1, 2, 3, 5]]
    assert get_beam_search_score(3, -0.4, 0.0) == pytest.approx(-0.4)
    assert get_beam_search_score(0, -1.0) == -1.0  # an aborted beam with nothing generated


def test_sort_key_orders_as_the_score():
    """The log-space key ranks beams as vLLM's get_beam_search_score does wherever that
    score is representable (random lengths, cumulative logprobs and penalties)."""
    import random

    from libvllm.engine.beam_search import BeamSearchSequence, create_sort_beams_key_function

    rng = random.Random(0)
    for penalty in (-2.0, 0.0, 0.5, 1.0, 3.0):
        beams = [BeamSearchSequence([0], logprobs=[{}] * rng.randint(0, 9),
                                    cum_logprob=rng.choice([0.0, -rng.uniform(0, 30)]))
                 for _ in range(60)]
        key = create_sort_beams_key_function(penalty)
        by_key = sorted(beams, key=key, reverse=True)
        by_score = sorted(beams, key=lambda b: get_beam_search_score(
            len(b.logprobs), b.cum_logprob, penalty), reverse=True)
        scores = [get_beam_search_score(len(b.logprobs), b.cum_logprob, penalty)
                  for b in by_key]
        assert scores == pytest.approx([get_beam_search_score(
            len(b.logprobs), b.cum_logprob, penalty) for b in by_score])


def test_abort_returns_the_last_completed_step():
    """vLLM's abort case: the beams of the last full step come back with reason abort."""
    table = {1: {2: -0.1, 99: -0.2}, 2: {3: -0.1}}
    best = beam_search(_fake_step(table), [1], BeamSearchParams(beam_width=2, max_tokens=5),
                       set(), None)
    assert [b.tokens for b in best] == [[1, 2], [1, 99]]
    assert all(b.finish_reason == "abort" for b in best)
    assert best[0].cum_logprob == pytest.approx(-0.1)


def test_ignore_eos_keeps_eos_beams_running():
    table = {1: {0: -0.1, 2: -0.2}, 0: {3: -0.1}, 2: {3: -0.1}, 3: {3: -0.1}}
    best = beam_search(_fake_step(table), [1], BeamSearchParams(
        beam_width=2, max_tokens=2, ignore_eos=True), {0}, None)
    assert [b.tokens for b in best] == [[1, 0, 3], [1, 2, 3]]
    assert all(b.finish_reason == "length" for b in best)


def test_beam_search_params_checks_and_eos_ids():
    for bad, msg in ((0, "beam_width must be at least 1, got 0."),
                     (2.0, "beam_width must be an int")):
        with pytest.raises(InvalidArgumentError, match=msg):
            BeamSearchParams(beam_width=bad, max_tokens=1)
    assert get_beam_search_eos_token_ids({"eos_token_id": [7, 9]}, 2) == {2, 7, 9}
    assert get_beam_search_eos_token_ids({}, None) == set()


def test_completion_beams_equal_transformers(client, hf_test_model,  # noqa: F811
                                             hf_test_tokenizer):
    """vLLM's test_beam_search_single_input: prompt + beam tokens equal Transformers'
    sequences (pad ids removed), in its order, for beam width 4."""
    import torch

    prompt, width, max_tokens = "Once upon a time, there was a", 4, 8
    ids = hf_test_tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        hf = hf_test_model.generate(ids, do_sample=False, max_new_tokens=max_tokens,
                                    num_beams=width, num_return_sequences=width)
    pad = hf_test_tokenizer.pad_token_id
    want = [[t for t in seq.tolist() if t != pad] for seq in hf]
    res = ok(client, "/v1/completions", {
        "prompt": ids[0].tolist(), "use_beam_search": True, "n": width, "temperature": 0,
        "max_tokens": max_tokens, "return_token_ids": True, "logprobs": 2})
    got = [ids[0].tolist() + c["token_ids"] for c in res["choices"]]
    assert got == want
    assert [c["index"] for c in res["choices"]] == list(range(width))
    assert all(len(c["logprobs"]["tokens"]) == len(c["token_ids"]) for c in res["choices"])
    assert res["usage"]["completion_tokens"] == sum(len(c["token_ids"])
                                                    for c in res["choices"])


def test_completion_beams_across_prompts(client):  # noqa: F811
    """Each prompt's beams as a request of its own gives them, in order; every step's
    engine requests carry the call's priority and cache_salt."""
    body = {"n": 2, "use_beam_search": True, "max_tokens": 3, "return_token_ids": True}
    spy = Spy(client)
    res = ok(spy, "/v1/completions", {**body, "prompt": ["Hello", "The sky is"],
                                      "priority": 2, "cache_salt": "s"})
    assert [c["index"] for c in res["choices"]] == [0, 1, 2, 3]
    alone = [ok(client, "/v1/completions", {**body, "prompt": p})["choices"]
             for p in ("Hello", "The sky is")]
    assert [c["token_ids"] for c in res["choices"]] == \
        [c["token_ids"] for choices in alone for c in choices]
    assert len(spy.kwargs) == 2 * 2 * 3 - 2  # 1 + 2 + 2 requests a prompt (3 steps)
    assert {(k["priority"], k["cache_salt"]) for k in spy.kwargs} == {(2, "s")}
    assert all(p.max_tokens == 1 and p.logprobs == 4 for p in spy.params)


def test_choice_indexes_have_no_gaps(client):  # noqa: F811
    """A prompt that ends with fewer than n beams (max_tokens 0: the prompt itself): the
    choices are numbered in order, as vLLM's index=len(choices)."""
    res = ok(client, "/v1/completions", {"prompt": ["Hi", "Yo"], "n": 3, "max_tokens": 0,
                                         "echo": True, "use_beam_search": True})
    assert [c["index"] for c in res["choices"]] == [0, 1]
    assert [c["text"] for c in res["choices"]] == ["Hi", "Yo"]


@pytest.mark.parametrize("penalty", [-1000.0, 1000.0])
def test_extreme_length_penalties_rank_without_overflow(client, penalty):  # noqa: F811
    res = ok(client, "/v1/completions", {"prompt": "Hi", "n": 2, "max_tokens": 3,
                                         "use_beam_search": True, "length_penalty": penalty})
    assert len(res["choices"]) == 2
    res = call(client, "/v1/completions", '{"prompt": "Hi", "use_beam_search": true, '
                                          '"length_penalty": 1e999}')
    assert res.status == 400 and "length_penalty must be a finite number" in res.body


def test_cancel_stops_the_step_in_flight_and_later_steps():
    class Step:
        cancelled = closed = False

        def cancel(self):
            self.cancelled = True

        def close(self):
            self.closed = True

    steps = BeamSteps()
    steps.cancel()  # nothing in flight yet
    assert steps.cancelled
    steps = BeamSteps()
    steps.step = Step()
    steps.close()
    assert steps.cancelled and steps.step.cancelled and steps.step.closed


@pytest.mark.parametrize("body, message, param", [
    ({"stream": True}, "Streaming is not currently supported with beam search", "stream"),
    ({"allowed_token_ids": [1, 2]}, "Beam allowlists require the V2 model runner",
     "allowed_token_ids"),
    ({"response_format": {"type": "json_object"}},
     "Structured outputs are not supported with beam search", "structured_outputs"),
    ({"n": 11}, "Requested sample logprobs of 22, which is greater than max allowed: 20 "
     "(beam search asks 2 x n)", "n"),  # refused before any step, max_tokens 0 included
    ({"n": 11, "max_tokens": 0}, "Requested sample logprobs of 22", "n"),
    ({"max_tokens": -1}, "max_tokens must be at least 0, got -1.", "max_tokens"),
])
def test_completion_beam_search_refusals(client, body, message, param):  # noqa: F811
    error = err(client, "/v1/completions", {"prompt": "Hi", "use_beam_search": True,
                                            "max_tokens": 2, **body})
    assert message in error["message"]
    if param:
        assert error["param"] == param


def test_chat_beams_are_the_choices(client):  # noqa: F811
    """Chat completions with use_beam_search: the rendered prompt's beams, best first, equal
    the completions endpoint's beams over the same prompt ids."""
    messages = [{"role": "user", "content": "Name a color."}]
    chat = ok(client, "/v1/chat/completions", {
        "messages": messages, "use_beam_search": True, "n": 3, "max_tokens": 4,
        "return_token_ids": True, "logprobs": True, "top_logprobs": 2})
    res = ok(client, "/v1/completions", {
        "prompt": chat["prompt_token_ids"], "use_beam_search": True, "n": 3, "max_tokens": 4,
        "return_token_ids": True})
    assert [c["token_ids"] for c in chat["choices"]] == \
        [c["token_ids"] for c in res["choices"]]
    assert [c["index"] for c in chat["choices"]] == [0, 1, 2]
    assert all(c["message"]["role"] == "assistant" for c in chat["choices"])
    assert all(len(c["logprobs"]["content"]) == len(c["token_ids"]) for c in chat["choices"])
    error = err(client, "/v1/chat/completions", {
        "messages": messages, "use_beam_search": True, "stream": True})
    assert error["message"] == "Streaming is not currently supported with beam search"
