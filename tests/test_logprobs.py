"""Logprobs: gathering and ranks in the Sampler, per-request assembly, output kinds.

Mirrors vLLM 0.33 tests/v1/sample/test_logprobs.py (the structure checks of
_run_and_validate: a position holds k or k + 1 entries, the chosen token is always
there with its rank, ranks 1..k are all present, cumulative_logprob is the sum of the
chosen logprobs, prompt logprobs start with None and cover the prompt; raw logprobs are
taken before any logits processing; decoded tokens never end in U+FFFD) and
tests/v1/engine/test_output_processor.py (test_logprobs_processor over all output kinds,
test_delta_output_without_new_tokens_returns_empty_logprobs), re-expressed for our API.
Oracle: log_softmax / sort of the same logits computed directly in the test.
"""

from __future__ import annotations

import pytest
import torch

from libvllm.engine.engine_core.engine_core_messages import EngineCoreOutput
from libvllm.engine.gguf.reader import GGUFReader
from libvllm.engine.logprobs import Logprob, append_logprobs_for_next_position
from libvllm.engine.logprobs_processor import LogprobsProcessor
from libvllm.engine.output_processor import OutputProcessor
from libvllm.engine.request import Request, RequestStatus
from libvllm.engine.sample.metadata import build_sampling_metadata
from libvllm.engine.sample.ops.logprobs import gather_logprobs
from libvllm.engine.sample.sampler import Sampler
from libvllm.engine.sampling_params import RequestOutputKind, SamplingParams
from libvllm.engine.tokenizer import Tokenizer


def _core_out(req, new_ids, new_logprobs=None, new_prompt_logprobs=None):
    """What the engine core reports for `req` (engine/engine_core/engine_core.py)."""
    return EngineCoreOutput(req.request_id, new_ids, new_logprobs, new_prompt_logprobs,
                            req.get_finished_reason(), req.stop_reason, req.num_cached_tokens)

CPU = torch.device("cpu")


def test_rank_counts_tokens_at_least_as_likely():
    # vLLM's batched_count_greater_than: rank = #{v : logprob(v) >= logprob(token)}
    logprobs = torch.log_softmax(torch.tensor([[2.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]]), -1)
    out = gather_logprobs(logprobs, 2, torch.tensor([2, 0]))
    assert out.selected_token_ranks.tolist() == [3, 4]  # ties count against the token
    assert out.logprob_token_ids[0].tolist()[0] == 2 and out.logprob_token_ids.shape == (2, 3)
    torch.testing.assert_close(out.logprobs[:, 0], logprobs[[0, 1], [2, 0]])
    torch.testing.assert_close(out.logprobs[0, 1:], logprobs[0].topk(2).values)
    assert gather_logprobs(logprobs, 0, torch.tensor([0, 1])).logprobs.shape == (2, 1)


def test_sampler_returns_raw_logprobs_before_processing():
    torch.manual_seed(0)
    vocab = 50
    logits = torch.randn(3, vocab)
    sps = [SamplingParams(temperature=0.0, logprobs=3, logit_bias={7: 30.0}),
           SamplingParams(temperature=0.7, seed=1, logprobs=0, repetition_penalty=1.8),
           SamplingParams(temperature=0.0)]
    md = build_sampling_metadata(sps, [[1, 2], [3, 4], [5, 6]], [1, 1, 1],
                                 {1: torch.Generator().manual_seed(1)}, vocab, CPU)
    assert md.max_num_logprobs == 3  # the batch maximum; the request keeps its own k
    out = Sampler()(logits.clone(), md)
    raw = torch.log_softmax(logits, -1)
    sampled = out.sampled_token_ids
    assert sampled[0] == 7  # the bias decided the token ...
    lp = out.logprobs_tensors
    torch.testing.assert_close(lp.logprobs[:, 0], raw.gather(1, sampled[:, None])[:, 0])
    torch.testing.assert_close(lp.logprobs[:, 1:], raw.topk(3).values)  # ... not the logprobs
    assert lp.selected_token_ranks[2] == 1  # plain greedy: rank 1
    assert lp.selected_token_ranks[0] == (raw[0] >= raw[0, 7]).sum()


def test_whole_vocab_logprobs():
    md = build_sampling_metadata([SamplingParams(temperature=0.0, logprobs=-1)], [[1]], [1],
                                 {}, 10, CPU)
    assert md.max_num_logprobs == 10
    out = Sampler()(torch.randn(1, 10), md)
    assert out.logprobs_tensors.logprobs.shape == (1, 11)


def test_append_position_dedups_the_sampled_token():
    pos: list = []
    append_logprobs_for_next_position(pos, [5, 5, 9], [-0.1, -0.1, -2.0], ["a", "a", "b"], 1, 2)
    assert pos == [{5: Logprob(-0.1, 1, "a"), 9: Logprob(-2.0, 2, "b")}]
    append_logprobs_for_next_position(pos, [4, 5, 9], [-3.0, -0.1, -2.0], [None] * 3, 7, 1)
    assert pos[1] == {4: Logprob(-3.0, 7, None), 5: Logprob(-0.1, 1, None)}  # k=1 of a k=2 row


@pytest.fixture(scope="module")
def tokenizer(model_path):
    with GGUFReader(model_path) as r:
        return Tokenizer.from_gguf_metadata(r.metadata)


def test_split_character_is_repaired_from_context(tokenizer):
    ids = tokenizer.encode("🚀", add_special_tokens=False)
    assert len(ids) > 1  # byte-level pieces of one character
    proc = LogprobsProcessor(tokenizer.backend, num_logprobs=0, num_prompt_logprobs=None)
    pieces = []
    for tok in ids:
        proc.update_from_output(_lists([[tok]], [[-0.5]], [1]), None)
        pieces.append(proc.logprobs[-1][tok].decoded_token)
    assert all(not p.endswith("\ufffd") for p in pieces)
    assert "".join(pieces) == "🚀" and pieces[-1] == "🚀"
    assert proc.cumulative_logprob == pytest.approx(-0.5 * len(ids))


def _lists(token_ids, logprobs, ranks):
    from libvllm.engine.sample.outputs import LogprobsLists
    return LogprobsLists(token_ids, logprobs, ranks)


# ---------------------------------------------------------------- output processor

PROMPT = "The quick brown fox jumps over"
NUM_GEN = 6


def _fake_core(tokenizer, num_logprobs, num_prompt_logprobs, seed=0):
    """Per step: the token, the sample logprobs rows of vLLM's layout, and (step 0 only)
    the prompt logprobs, from random logits whose log_softmax is the oracle."""
    g = torch.Generator().manual_seed(seed)
    vocab = tokenizer.vocab_size
    prompt = tokenizer.encode(PROMPT, add_special_tokens=False)
    prompt_lp = torch.log_softmax(torch.randn(len(prompt) - 1, vocab, generator=g), -1)
    gen_lp = torch.log_softmax(torch.randn(NUM_GEN, vocab, generator=g), -1)
    tokens = torch.multinomial(gen_lp.exp(), 1, generator=g)[:, 0]
    steps = []
    for i in range(NUM_GEN):
        sample = None if num_logprobs is None else gather_logprobs(
            gen_lp[i:i + 1], vocab if num_logprobs == -1 else num_logprobs,
            tokens[i:i + 1]).tolists()
        plp = None
        if i == 0 and num_prompt_logprobs is not None:
            plp = gather_logprobs(prompt_lp, num_prompt_logprobs,
                                  torch.tensor(prompt[1:])).tolists()
        steps.append((tokens[i].item(), sample, plp))
    return prompt, steps, gen_lp, prompt_lp


def _check_position(pos, token, k, oracle):
    assert token in pos
    rank = pos[token].rank
    assert rank == (oracle >= oracle[token]).sum().item()
    assert len(pos) == (k if rank <= k and k != 0 else k + 1)
    assert {r for r in range(1, k + 1)} <= {lp.rank for lp in pos.values()}
    for tok, lp in pos.items():
        assert lp.logprob == pytest.approx(oracle[tok].item(), abs=1e-6)


@pytest.mark.parametrize("kind", list(RequestOutputKind))
@pytest.mark.parametrize(("num_logprobs", "num_prompt_logprobs"),
                         [(None, None), (3, None), (None, 2), (0, 0), (5, 4)])
def test_output_processor_assembles_logprobs(tokenizer, kind, num_logprobs,
                                             num_prompt_logprobs):
    prompt, steps, gen_lp, prompt_lp = _fake_core(tokenizer, num_logprobs, num_prompt_logprobs)
    sp = SamplingParams(max_tokens=NUM_GEN, logprobs=num_logprobs,
                        prompt_logprobs=num_prompt_logprobs, output_kind=kind)
    req = Request("r", prompt, sp, None, 0.0, 16)
    op = OutputProcessor(tokenizer)
    op.add_request(req, PROMPT)
    tokens, logprobs, prompt_logprobs, cumulative = [], [], None, None
    for i, (tok, sample, plp) in enumerate(steps):
        req.append_output_token_ids([tok])
        if i == NUM_GEN - 1:
            req.status = RequestStatus.FINISHED_LENGTH_CAPPED
        outs, stopped = op.process_outputs([_core_out(req, [tok], sample, plp)])
        assert not stopped
        for out in outs:
            comp = out.outputs[0]
            if kind == RequestOutputKind.DELTA:
                tokens += comp.token_ids
                logprobs += comp.logprobs or []
                if out.prompt_logprobs:
                    assert prompt_logprobs is None  # delivered once
                    prompt_logprobs = out.prompt_logprobs
            else:
                tokens, logprobs = comp.token_ids, comp.logprobs or []
                prompt_logprobs = out.prompt_logprobs
            cumulative = comp.cumulative_logprob
            if num_logprobs is None:
                assert comp.logprobs is None and comp.cumulative_logprob is None
    assert tokens == [s[0] for s in steps]
    assert not op.request_states
    if num_logprobs is not None:
        assert len(logprobs) == NUM_GEN
        for i, (pos, tok) in enumerate(zip(logprobs, tokens)):
            _check_position(pos, tok, num_logprobs, gen_lp[i])
            alone = tokenizer.decode([tok], skip_special_tokens=False)
            decoded = pos[tok].decoded_token
            assert decoded == alone if not alone.endswith("\ufffd") else \
                not decoded.endswith("\ufffd")  # a lone byte piece is repaired or ""
        assert cumulative == pytest.approx(sum(p[t].logprob for p, t in zip(logprobs, tokens)))
    if num_prompt_logprobs is None:
        assert prompt_logprobs is None
    else:
        assert len(prompt_logprobs) == len(prompt) and prompt_logprobs[0] is None
        for i, (pos, tok) in enumerate(zip(prompt_logprobs[1:], prompt[1:])):
            _check_position(pos, tok, num_prompt_logprobs, prompt_lp[i])


def test_detokenize_false_gives_no_text_and_no_decoded_tokens(tokenizer):
    # upstream tests/v1/sample/test_sampling_params_e2e.py::test_detokenize_false
    prompt, steps, _, _ = _fake_core(tokenizer, 3, 3)
    sp = SamplingParams(detokenize=False, logprobs=3, prompt_logprobs=3, max_tokens=NUM_GEN)
    req = Request("r", prompt, sp, None, 0.0, 16)
    op = OutputProcessor(tokenizer)
    op.add_request(req, PROMPT)
    tok, sample, plp = steps[0]
    req.append_output_token_ids([tok])
    (out,), _ = op.process_outputs([_core_out(req, [tok], sample, plp)])
    comp = out.outputs[0]
    assert comp.text == "" and comp.token_ids == [tok]
    for pos in [*out.prompt_logprobs[1:], *comp.logprobs]:
        assert 3 <= len(pos) <= 4
        assert all(lp.decoded_token is None for lp in pos.values())


def test_delta_output_without_new_tokens_has_empty_logprobs(tokenizer):
    prompt, steps, _, _ = _fake_core(tokenizer, 2, None)
    sp = SamplingParams(logprobs=2, output_kind=RequestOutputKind.DELTA)
    req = Request("r", prompt, sp, None, 0.0, 16)
    op = OutputProcessor(tokenizer)
    op.add_request(req, PROMPT)
    tok, sample, _ = steps[0]
    req.append_output_token_ids([tok])
    op.process_outputs([_core_out(req, [tok], sample)])
    (aborted,) = op.abort_requests([req.request_id])
    comp = aborted.outputs[0]
    assert comp.finish_reason == "abort" and comp.token_ids == [] and comp.logprobs == []
