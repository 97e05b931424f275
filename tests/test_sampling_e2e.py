"""Sampling parameters end to end on the real default model (SmolLM2-135M-Instruct Q4_1).

Mirrors vLLM 0.33 tests/v1/sample/test_sampling_params_e2e.py (n > 1, penalties,
detokenize=False, bad_words, allowed_token_ids, seed), tests/samplers/test_logprobs.py
(test_ranks: greedy tokens have rank 1, ranks 1..k present) and
tests/v1/sample/test_logprobs.py (logprobs and prompt logprobs against HF; prompt
logprobs with chunked prefill). Oracle: Hugging Face transformers in fp32 loading the
same GGUF; log_softmax of its logits for the sampled tokens (tolerance 1e-4) and the
prompt tokens. The engine runs with a 32-token budget so prompts arrive in chunks.
Seeded sampling in any batch composition is in test_generate_parity.py.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from libvllm.engine.config import EngineConfig
from libvllm.engine.errors import InvalidArgumentError, NotFoundError
from libvllm.engine.llm_engine import LLMEngine
from libvllm.engine.sampling_params import RequestOutputKind, SamplingParams

pytestmark = pytest.mark.slow
TOL = 1e-4
FINAL = RequestOutputKind.FINAL_ONLY


@pytest.fixture(scope="module")
def engine(model_path):
    return LLMEngine.from_config(EngineConfig(
        model=model_path, max_model_len=512, max_num_batched_tokens=32, max_num_seqs=8))


@pytest.fixture(scope="module")
def hf_model(hf_test_model):
    return hf_test_model


@pytest.fixture(scope="module")
def chat(engine):
    text = engine.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}])
    return engine.tokenizer.encode(text, add_special_tokens=False)


def _hf_logprobs(hf_model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].float(), -1)


def _run(engine, requests: dict[str, tuple[list[int], SamplingParams]]):
    for rid, (prompt, sp) in requests.items():
        engine.add_request(rid, prompt, sp)
    final = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
    return final


def _check_position(pos, token, k, oracle):
    assert token in pos
    assert len(pos) in (k, k + 1)
    assert pos[token].logprob == pytest.approx(oracle[token].item(), abs=TOL)
    top = oracle.topk(k)
    for rank, (tok, lp) in enumerate(zip(top.indices.tolist(), top.values.tolist()), 1):
        assert pos[tok].rank == rank and pos[tok].logprob == pytest.approx(lp, abs=TOL)


def test_greedy_logprobs_match_transformers(engine, hf_model, chat):
    k = 5
    out = _run(engine, {"g": (chat, SamplingParams(temperature=0.0, max_tokens=6,
                                                   logprobs=k))})["g"]
    comp = out.outputs[0]
    assert out.prompt_logprobs is None and len(comp.logprobs) == len(comp.token_ids) == 6
    oracle = _hf_logprobs(hf_model, chat + comp.token_ids)
    for i, (pos, tok) in enumerate(zip(comp.logprobs, comp.token_ids)):
        assert pos[tok].rank == 1
        _check_position(pos, tok, k, oracle[len(chat) - 1 + i])
    assert comp.cumulative_logprob == pytest.approx(
        sum(p[t].logprob for p, t in zip(comp.logprobs, comp.token_ids)))
    assert "".join(p[t].decoded_token for p, t in zip(comp.logprobs, comp.token_ids)) \
        == comp.text


def test_prompt_logprobs_match_transformers_across_chunks_and_cache(engine, hf_model, chat):
    # the plain request fills the prefix cache; prompt logprobs must not read it
    sp = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=3)
    outs = _run(engine, {"warm": (chat, SamplingParams(temperature=0.0, max_tokens=1))})
    assert len(chat) > 32  # two chunks at least
    outs = _run(engine, {"p": (chat, sp)})
    plp = outs["p"].prompt_logprobs
    assert outs["p"].num_cached_tokens == 0
    assert len(plp) == len(chat) and plp[0] is None
    oracle = _hf_logprobs(hf_model, chat)
    for i, (pos, tok) in enumerate(zip(plp[1:], chat[1:])):
        _check_position(pos, tok, 3, oracle[i])


def test_n_seeded_children_reproduce_and_match_n1_seeds(engine, chat):
    sp = SamplingParams(n=3, temperature=1.0, seed=1234, max_tokens=6, output_kind=FINAL)
    first = _run(engine, {"n": (chat, sp), **{f"s{i}": (chat, SamplingParams(
        temperature=1.0, seed=1234 + i, max_tokens=6)) for i in range(3)}})
    again = _run(engine, {"n": (chat, sp)})["n"]
    assert [c.index for c in first["n"].outputs] == [0, 1, 2]
    texts = [c.token_ids for c in first["n"].outputs]
    assert texts == [c.token_ids for c in again.outputs]
    assert len({tuple(t) for t in texts}) > 1  # the children differ
    assert [first[f"s{i}"].outputs[0].token_ids for i in range(3)] == texts


def test_n_delta_streams_carry_their_index(engine, chat):
    sp = SamplingParams(n=2, temperature=1.0, seed=7, max_tokens=4,
                        output_kind=RequestOutputKind.DELTA, logprobs=1)
    engine.add_request("d", chat, sp)
    ids, lps, finished = {0: [], 1: []}, {0: [], 1: []}, False
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert out.request_id == "d" and len({c.index for c in out.outputs}) == \
                len(out.outputs)
            for c in out.outputs:
                ids[c.index] += c.token_ids
                lps[c.index] += c.logprobs
            finished = out.finished
    final = _run(engine, {"f": (chat, SamplingParams(n=2, temperature=1.0, seed=7,
                                                     max_tokens=4, output_kind=FINAL))})["f"]
    assert finished and [ids[0], ids[1]] == [c.token_ids for c in final.outputs]
    assert all(len(lps[i]) == len(ids[i]) for i in (0, 1))


def test_abort_of_parent_aborts_children(engine, chat):
    engine.add_request("a", chat, SamplingParams(n=3, temperature=1.0, max_tokens=50))
    engine.step()
    engine.abort_request("a")
    outs = engine.step()
    assert len(outs) == 1 and outs[0].finished
    assert sorted(c.index for c in outs[0].outputs) == [0, 1, 2]
    assert {c.finish_reason for c in outs[0].outputs} == {"abort"}
    assert not engine.has_unfinished_requests()
    with pytest.raises(NotFoundError):
        engine.abort_request("a")


def test_penalties_curb_repetition(engine):
    # greedy continues the repetition; each penalty must make it repeat less
    prompt = engine.tokenizer.encode("hello " * 6 + "hello", add_special_tokens=False)
    word = prompt[-1]
    base = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    runs = {"plain": base, "rep": replace(base, repetition_penalty=1.8),
            "freq": replace(base, frequency_penalty=2.0),
            "pres": replace(base, presence_penalty=2.0)}
    # upstream test_penalties: everything at once runs
    runs["all"] = SamplingParams(temperature=1.2, presence_penalty=1.2, frequency_penalty=1.2,
                                 repetition_penalty=1.2, min_p=0.5, top_p=0.5, top_k=3,
                                 seed=0, max_tokens=4)
    outs = _run(engine, {k: (prompt, sp) for k, sp in runs.items()})
    plain = outs["plain"].outputs[0].token_ids.count(word)
    assert plain >= 3
    for name in ("rep", "freq", "pres"):
        assert outs[name].outputs[0].token_ids.count(word) < plain, name


def test_allowed_token_ids_and_logit_bias_force_tokens(engine, chat):
    tokens = (5, 100, 2518, 9834)
    outs = _run(engine, {
        **{f"a{t}": (chat, SamplingParams(temperature=0.0, max_tokens=1, allowed_token_ids=[t]))
           for t in tokens},
        **{f"b{t}": (chat, SamplingParams(temperature=0.0, max_tokens=1,
                                          logit_bias={t: 100.0})) for t in tokens}})
    for t in tokens:
        assert outs[f"a{t}"].outputs[0].token_ids == [t]
        assert outs[f"b{t}"].outputs[0].token_ids == [t]
    for bad in ([], [-1], [10000000]):
        with pytest.raises(InvalidArgumentError):
            engine.add_request("x", chat, SamplingParams(allowed_token_ids=bad))


def test_bad_words_are_avoided(engine, chat):
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    text = _run(engine, {"g": (chat, greedy)})["g"].outputs[0].text
    bad = " ".join(text.split()[:2])
    out = _run(engine, {"b": (chat, SamplingParams(temperature=0.0, max_tokens=8,
                                                   bad_words=[bad]))})["b"].outputs[0]
    enc = [engine.tokenizer.encode(p + bad.lstrip(), add_special_tokens=False)
           for p in ("", " ")]
    ids = out.token_ids
    for seq in enc:
        assert all(ids[i:i + len(seq)] != seq for i in range(len(ids)))
    assert out.text != text


def test_min_tokens_holds_back_eos(engine, chat):
    outs = _run(engine, {"f": (chat, SamplingParams(temperature=0.0, max_tokens=14)),
                         "m": (chat, SamplingParams(temperature=0.0, max_tokens=14,
                                                    min_tokens=12))})
    free, held = outs["f"].outputs[0], outs["m"].outputs[0]
    assert free.finish_reason == "stop" and len(free.token_ids) < 12
    assert len(held.token_ids) >= 12
    assert engine.tokenizer.eos_token_id not in held.token_ids[:11]


def test_detokenize_false(engine, chat):
    out = _run(engine, {"d": (chat, SamplingParams(detokenize=False, max_tokens=4,
                                                   logprobs=3, prompt_logprobs=3))})["d"]
    comp = out.outputs[0]
    assert comp.text == "" and len(comp.token_ids) == 4
    for pos in [*out.prompt_logprobs[1:], *comp.logprobs]:
        assert 3 <= len(pos) <= 4 and all(lp.decoded_token is None for lp in pos.values())


def test_add_request_validates_against_the_model(engine, chat):
    with pytest.raises(InvalidArgumentError, match="greater than max allowed: 20"):
        engine.add_request("v", chat, SamplingParams(logprobs=21))
    with pytest.raises(InvalidArgumentError, match="in stop_token_ids contain out-of-vocab"):
        engine.add_request("v", chat, SamplingParams(stop_token_ids=[10**7]))
    with pytest.raises(InvalidArgumentError, match="min_tokens must be less than or equal"):
        engine.add_request("v", chat, SamplingParams(max_tokens=None, min_tokens=10**6))
    sp = SamplingParams(max_tokens=None)
    engine.add_request("v", chat, sp)  # the caller's params are not modified
    assert sp.max_tokens is None and sp.all_stop_token_ids == set()
    engine.abort_request("v")
    engine.step()
