"""thinking_token_budget: the end of a reasoning block forced after its budget (vLLM 0.33).

Ports vLLM 0.33 tests/v1/worker/test_gpu_thinking_budget.py (the 13 Model Runner V2 cases,
re-expressed as: the token ids so far -> the logits the sampler leaves; the two-row cases
become two successive steps), the SamplingParams / request checks of
tests/v1/logits_processors/test_correctness.py and
tests/entrypoints/openai/chat_completion/test_thinking_token_budget_validation.py, the
ReasoningConfig rules of vllm/config/reasoning.py, and
test_thinking_token_budget.py's end-to-end case on the default model.
Oracles: the upstream expectations; a direct reading of the rule on the whole sequence
(`_reference`) for random streams; for the engine, its own greedy run without a budget
(the free tokens) and on the prompt extended by the free and forced tokens (the rest).
"""

from __future__ import annotations

import json
import random

import pytest
import torch

from libvllm.engine.async_llm import AsyncLLM
from libvllm.engine.config import EngineConfig
from libvllm.engine.entrypoints.openai.api import handle_openai_request
from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.llm_engine import LLMEngine
from libvllm.engine.reasoning.config import resolve_reasoning_token_ids
from libvllm.engine.sample.metadata import build_sampling_metadata, reads_output_token_ids
from libvllm.engine.sample.ops.thinking_budget import NO_FORCE, ThinkingScan, forced_tokens
from libvllm.engine.sample.sampler import Sampler
from libvllm.engine.sampling_params import SamplingParams

START, END, END_A, END_B = 90, 91, 92, 93
VOCAB = 128
SINGLE = ([START], [END], [END])
MULTI = ([START], [END_A, END_B], [END_A, END_B])
DISTINCT = ([START], [END_A, END_B], [END])
DEVICES = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])


def _params(budget: int | None, ids=SINGLE, **kw) -> SamplingParams:
    sp = SamplingParams(thinking_token_budget=budget, **kw)
    sp.update_from_reasoning_config(ids)
    return sp


def _logits_after(tokens: list[int], sp: SamplingParams, device: torch.device,
                  logits: torch.Tensor | None = None, scan: ThinkingScan | None = None,
                  in_flight: bool = False):
    """The logits the sampler leaves after S = tokens; in_flight: S[-1] is a placeholder
    on the host and known only on the device (async scheduling)."""
    last = torch.tensor([tokens[-1]], device=device) if in_flight else None
    host = tokens[:-1] + [-1] if in_flight else tokens
    md = build_sampling_metadata([sp], [host], [1], {}, VOCAB, device,
                                 None if scan is None else [scan], last)
    logits = torch.zeros(1, VOCAB) if logits is None else logits
    return Sampler.apply_logits_processors(logits.to(device), md).cpu()


MODES = [False, True]  # the last token known on the host / only on the device


def _forced(out: torch.Tensor, token: int) -> None:
    want = torch.zeros_like(out)
    want[0, token] = 1.0e9
    torch.testing.assert_close(out, want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("in_flight", MODES, ids=["known", "in-flight"])
def test_forces_end_after_budget_reached(device, in_flight):
    logits = torch.arange(VOCAB, dtype=torch.float32).view(1, -1)
    out = _logits_after([1, START, 10, 11, 12], _params(3), device, logits.clone(),
                       in_flight=in_flight)
    logits[0, END] = 1.0e9
    torch.testing.assert_close(out, logits)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("in_flight", MODES, ids=["known", "in-flight"])
def test_restores_masked_end_token(device, in_flight):
    logits = torch.zeros(1, VOCAB)
    logits[0, END] = -float("inf")
    _forced(_logits_after([1, START, 10, 11, 12], _params(3), device, logits,
                          in_flight=in_flight), END)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tokens,sp", [
    ([1, START, 10, 11], _params(3)),  # before the budget
    ([1, START, 10, END, 20, 21, 22], _params(3, DISTINCT)),  # after the natural end
    ([1, START, 10, 11, 12], SamplingParams()),  # a plain request
    ([1, START, 10, 11, 12, END, 13], _params(3)),  # the prompt's latest marker is an end
    ([1, START, 10, 11, 12], _params(2**40)),  # beyond int32: unlimited
], ids=["before", "natural-end", "plain", "prompt-end", "oversized"])
@pytest.mark.parametrize("in_flight", MODES, ids=["known", "in-flight"])
def test_nothing_forced(device, tokens, sp, in_flight):
    assert torch.all(_logits_after(tokens, sp, device, in_flight=in_flight) == 0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ids", [MULTI, DISTINCT], ids=["multi", "distinct"])
@pytest.mark.parametrize("in_flight", MODES, ids=["known", "in-flight"])
def test_multi_token_end_marker_one_token_a_step(device, ids, in_flight):
    sp = _params(3, ids)
    _forced(_logits_after([1, START, 10, 11, 12], sp, device, in_flight=in_flight), END_A)
    _forced(_logits_after([1, START, 10, 11, 12, END_A], sp, device, in_flight=in_flight),
            END_B)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("in_flight", MODES, ids=["known", "in-flight"])
def test_uses_latest_prefill_start_boundary(device, in_flight):
    tokens = [1, START, 10, 11, 12, END, 13, START, 14, 15, 16]
    _forced(_logits_after(tokens, _params(3), device, in_flight=in_flight), END)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("in_flight", MODES, ids=["known", "in-flight"])
def test_continues_end_prefix_from_prompt(device, in_flight):
    out = _logits_after([1, START, 10, 11, END_A], _params(3, MULTI), device,
                        in_flight=in_flight)
    _forced(out, END_B)


def test_greedy_sampling_applies_thinking_budget():
    sp = _params(3, temperature=0.0)
    md = build_sampling_metadata([sp], [[1, START, 10, 11, 12]], [1], {}, VOCAB,
                                 torch.device("cpu"))
    assert Sampler()(torch.zeros(1, VOCAB), md).sampled_token_ids.tolist() == [END]
    sp = _params(3, temperature=1.0, top_p=0.5, seed=3)  # sampled rows keep it too
    md = build_sampling_metadata([sp, SamplingParams(temperature=0.0)],
                                 [[1, START, 10, 11, 12], [1, 2]], [1, 1], {}, VOCAB,
                                 torch.device("cpu"))
    assert Sampler()(torch.zeros(2, VOCAB), md).sampled_token_ids.tolist()[0] == END


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_budget_rows_sample_without_a_host_sync():
    """Building the metadata and sampling a batch with forced and free budget rows, greedy
    and random, waits for the GPU nowhere (sampling stays on the device)."""
    cuda = torch.device("cuda")
    sps = [_params(3, temperature=0.0), _params(3, temperature=1.0),
           _params(9, temperature=0.7), SamplingParams(temperature=0.0)]
    tokens = [[1, START, 10, 11, 12]] * 4
    logits = torch.randn(4, VOCAB, device=cuda)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        md = build_sampling_metadata(sps, tokens, [1] * 4, {}, VOCAB, cuda)
        sampled = Sampler()(logits, md).sampled_token_ids
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert sampled[:2].tolist() == [END, END]


def test_incrementally_scans_long_generation():
    """A step scans its new tokens (and a marker's width), not the whole history."""
    tokens, scan = [1, START, *([10] * 16382)], ThinkingScan()
    sp = _params(32768)
    _logits_after(tokens, sp, torch.device("cpu"), scan=scan)
    assert scan.scanned == len(tokens) - 1 and scan.last_start == 1  # S[:-1]
    tokens.append(10)
    reads = []

    class Spy(list):
        def __getitem__(self, index):
            reads.append(index)
            return super().__getitem__(index)

    forced_tokens(Spy(tokens), 32768, SINGLE, scan)
    assert scan.scanned == len(tokens) - 1 and len(reads) <= 4


def _reference(tokens: list[int], budget: int, ids) -> int | None:
    """The rule read directly on the whole sequence."""
    start, end, natural = ids

    def last(marker):
        return max((i for i in range(len(tokens)) if tokens[i:i + len(marker)] == marker),
                   default=-1)

    ls, le = last(start), last(natural)
    if ls < 0 or ls <= le or len(tokens) - ls - len(start) < budget:
        return None
    p = max((p for p in range(1, len(end)) if tokens[-p:] == end[:p]), default=0)
    return end[p]


@pytest.mark.parametrize("ids", [SINGLE, MULTI, DISTINCT, ([START, 94], [END_A, END_B, END],
                                                            [END_B, END])])
def test_incremental_scan_equals_the_rule_on_random_streams(ids):
    rng = random.Random(0)
    alphabet = [START, 94, END, END_A, END_B, 10, 11]
    for _ in range(200):
        tokens, scan, budget = [1], ThinkingScan(), rng.randint(0, 4)
        for _ in range(40):
            tokens.append(rng.choice(alphabet))
            table, other = forced_tokens(tokens[:-1] + [-1], budget, ids, scan)  # S[-1] unread
            want = _reference(tokens, budget, ids)
            assert table.get(tokens[-1], other) == (NO_FORCE if want is None else want)


def test_validation_as_vllm():
    message = "`thinking_token_budget` must be a non-negative integer or -1 for unlimited."
    assert SamplingParams(thinking_token_budget=-1).thinking_token_budget is None
    assert SamplingParams().thinking_token_budget is None
    assert SamplingParams(thinking_token_budget=0).thinking_token_budget == 0
    assert SamplingParams(thinking_token_budget=10).thinking_token_budget == 10
    for bad in (-2, 0.6, 10.5, 10.0, True, "5"):
        with pytest.raises(InvalidArgumentError, match=message.replace("`", ".")):
            SamplingParams(thinking_token_budget=bad)
    with pytest.raises(InvalidArgumentError, match="thinking_token_budget is set but "
                       "reasoning_config is not configured. Please set --reasoning-parser "
                       "and/or --reasoning-config to use thinking_token_budget."):
        SamplingParams(thinking_token_budget=3).update_from_reasoning_config(None)
    # the last token is read on the device: a budget row does not wait for its step
    assert not reads_output_token_ids(_params(3))


class _Tok:
    def encode(self, text, add_special_tokens=True):
        return [ord(c) for c in text]


def test_reasoning_config_rules():
    """vllm/config/reasoning.py initialize_token_ids: config strings first, the parser's
    markers fill the gaps, the natural end is the parser's; none without both strings."""
    def ids(**kw):
        return resolve_reasoning_token_ids(EngineConfig(model="m", **kw), _Tok(), 200)

    assert ids() is None and ids(reasoning_start_str="<") is None
    assert ids(reasoning_start_str="<", reasoning_end_str=">!") == ([60], [62, 33], [62, 33])
    think = [ord(c) for c in "<think>"], [ord(c) for c in "</think>"]
    assert ids(reasoning_parser="qwen3") == (think[0], think[1], think[1])
    forced = [ord(c) for c in "Done.</think>"]
    assert ids(reasoning_parser="deepseek_r1", reasoning_end_str="Done.</think>") == (
        think[0], forced, think[1])
    with pytest.raises(InvalidArgumentError, match="failed to tokenize reasoning strings"):
        resolve_reasoning_token_ids(EngineConfig(model="m", reasoning_start_str="<",
                                                 reasoning_end_str=">"), type(
            "Empty", (), {"encode": lambda self, t, add_special_tokens: []})(), 200)
    with pytest.raises(InvalidArgumentError, match="not all below the model's vocabulary "
                       "size 100"):  # '<' is 60, '>' 62, 'x' 120
        resolve_reasoning_token_ids(EngineConfig(model="m", reasoning_start_str="<",
                                                 reasoning_end_str=">x"), _Tok(), 100)
    assert resolve_reasoning_token_ids(EngineConfig(model="m", reasoning_parser="qwen3"),
                                       None, 200) is None


# --- the engine on the default model ------------------------------------------------

START_STR, END_STR = ":", " So the answer is"
PROMPT = "The following numbers of the sequence 0, 1, 2, 3, 4, 5 are:"


@pytest.fixture(scope="module")
def engine(model_path):
    engine = LLMEngine.from_config(EngineConfig(
        model=model_path, device="cpu", max_model_len=256, max_num_seqs=4,
        reasoning_start_str=START_STR, reasoning_end_str=END_STR))
    yield engine
    engine.shutdown()


def _run(engine, prompts: dict[str, list[int]], sp: SamplingParams) -> dict[str, list[int]]:
    for rid, prompt in prompts.items():
        engine.add_request(rid, prompt, sp)
    done = {}
    while engine.has_unfinished_requests():
        done.update({o.request_id: list(o.outputs[0].token_ids) for o in engine.step()
                     if o.finished})
    return done


@pytest.mark.slow
def test_engine_forces_the_end_after_the_budget(engine):
    tok = engine.tokenizer
    start, end = (tok.encode(s, add_special_tokens=False) for s in (START_STR, END_STR))
    prompt = tok.encode(PROMPT)
    assert prompt[-len(start):] == start and len(end) > 1  # the prompt opens the block
    budget, n = 3, 10
    free = _run(engine, {"free": prompt}, SamplingParams(temperature=0, max_tokens=n))["free"]
    assert not set(free[:budget]) & {start[-1], end[0]}  # no marker of its own in between
    out = _run(engine, {"b": prompt, "plain": prompt}, SamplingParams(
        temperature=0, max_tokens=n, thinking_token_budget=budget))
    want = free[:budget] + end
    rest = _run(engine, {"rest": prompt + want},
                SamplingParams(temperature=0, max_tokens=n - len(want)))["rest"]
    assert out["b"] == want + rest
    plain = _run(engine, {"p": prompt}, SamplingParams(temperature=0, max_tokens=n,
                                                       thinking_token_budget=0))["p"]
    assert plain[:len(end)] == end  # budget 0: the first output token is forced


def test_engine_without_markers_refuses(model_path):
    engine = LLMEngine.from_config(EngineConfig(model=model_path, device="cpu",
                                                max_model_len=128))
    try:
        with pytest.raises(InvalidArgumentError, match="reasoning_config is not configured"):
            engine.add_request("x", "Hi", SamplingParams(thinking_token_budget=3))
        llm = AsyncLLM(engine)
        res = handle_openai_request(llm, "POST", "/v1/chat/completions", json.dumps({
            "messages": [{"role": "user", "content": "Hi"}], "thinking_token_budget": 3}),
            served_model_name="smol")
        assert res.status == 400 and "reasoning_config" in json.loads(res.body)["error"][
            "message"]
        for path, body in (("/v1/completions", {"prompt": "Hi"}), ("/v1/chat/completions", {
                "messages": [{"role": "user", "content": "Hi"}], "use_beam_search": True})):
            for bad in (10.0, "5", True, -2):  # no coercion, also under beam search (vLLM)
                res = handle_openai_request(llm, "POST", path, json.dumps({
                    **body, "thinking_token_budget": bad}), served_model_name="smol")
                error = json.loads(res.body)["error"]
                assert res.status == 400 and error["param"] == "thinking_token_budget", bad
                assert "must be a non-negative integer or -1" in error["message"]
        res = handle_openai_request(llm, "POST", "/v1/completions", json.dumps({
            "prompt": "Hi", "max_tokens": 1, "thinking_token_budget": -1}),
            served_model_name="smol")
        assert res.status == 200, res.body  # -1: unlimited, no markers needed
        llm.shutdown()
    finally:
        engine.shutdown()


@pytest.mark.slow
def test_the_markers_cross_to_an_engine_core_in_a_child(model_path):
    """The resolved marker ids travel with SamplingParams over the engine-core socket."""
    engine = LLMEngine.from_config(EngineConfig(
        model=model_path, max_model_len=256, multiprocessing=True,
        reasoning_start_str=START_STR, reasoning_end_str=END_STR))
    try:
        assert engine.is_multiprocess
        end = engine.tokenizer.encode(END_STR, add_special_tokens=False)
        out = _run(engine, {"c": engine.tokenizer.encode(PROMPT)}, SamplingParams(
            temperature=0, max_tokens=len(end), thinking_token_budget=0))
        assert out["c"] == end
    finally:
        engine.shutdown()


@pytest.mark.slow
def test_async_budget_rows_equal_sync_without_waiting(model_path):
    """Budget rows beside plain ones, no penalty row: async steps (the last token read on
    the device, steps overlapping) give the synchronous engine's tokens."""
    def run(async_scheduling: bool) -> dict[str, list[int]]:
        engine = LLMEngine.from_config(EngineConfig(
            model=model_path, device="cpu", max_model_len=256, max_num_seqs=4,
            async_scheduling=async_scheduling, reasoning_start_str=START_STR,
            reasoning_end_str=END_STR))
        try:
            prompt = engine.tokenizer.encode(PROMPT)
            out = {}
            for budget in (0, 2, 5):
                out.update(_run(engine, {f"b{budget}": prompt}, SamplingParams(
                    temperature=0, max_tokens=12, thinking_token_budget=budget)))
            engine.add_request("plain", prompt, SamplingParams(temperature=0, max_tokens=8))
            out.update(_run(engine, {"b1": prompt}, SamplingParams(
                temperature=0, max_tokens=8, thinking_token_budget=1)))  # beside "plain"
            return out, engine.tokenizer.encode(END_STR, add_special_tokens=False)
        finally:
            engine.shutdown()

    (sync, end), (asynchronous, _) = run(False), run(True)
    assert asynchronous == sync
    for budget in (0, 1, 2, 5):
        assert sync[f"b{budget}"][budget:budget + len(end)] == end
    assert sync["plain"][1:1 + len(end)] != end


def test_a_front_end_failure_shuts_the_core_down(model_path, monkeypatch):
    """LLMEngine.from_config: when the front end's set-up fails after the core started
    (here the reasoning markers' vocabulary check), the core client is shut down."""
    import libvllm.engine.llm_engine as llm_engine

    shut = []
    real = llm_engine.make_client

    def make_client(config):
        client, tokenizer = real(config)
        close = client.shutdown
        monkeypatch.setattr(client, "shutdown", lambda: (shut.append(1), close()))
        return client, tokenizer

    def refuse(*args):
        raise InvalidArgumentError("ReasoningConfig: the reasoning strings' token ids")

    monkeypatch.setattr(llm_engine, "make_client", make_client)
    monkeypatch.setattr("libvllm.engine.input_processor.resolve_reasoning_token_ids", refuse)
    with pytest.raises(InvalidArgumentError, match="reasoning strings"):
        LLMEngine.from_config(EngineConfig(model=model_path, device="cpu", max_model_len=64,
                                           reasoning_start_str="<", reasoning_end_str=">"))
    assert shut == [1]
