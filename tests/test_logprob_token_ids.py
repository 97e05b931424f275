"""logprob_token_ids: the logprobs of given token ids at each generated position, in place
of the top-k (vLLM 0.33 SamplingParams.logprob_token_ids).

Ports vLLM 0.33 tests/entrypoints/openai/chat_completion/test_logprob_token_ids.py (the
request-side decoupling of top_logprobs / logprobs from the ids, beam search and
echo-without-output refused, the returned entries are exactly the ids and the sampled
token, finite although allowed_token_ids masks them, streamed too) and the checks of
vllm/sampling_params.py _validate_logprobs. Oracle: log_softmax of the same logits in the
Sampler test; for the engine, the same engine's full-vocabulary logprobs (logprobs=-1,
checked against transformers by tests/test_logprobs.py) at those ids.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from libvllm.engine.async_llm import AsyncLLM
from libvllm.engine.config import EngineConfig
from libvllm.engine.entrypoints.openai.api import handle_openai_request
from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.llm_engine import LLMEngine
from libvllm.engine.sample.metadata import build_sampling_metadata
from libvllm.engine.sample.sampler import Sampler
from libvllm.engine.sampling_params import SamplingParams

CPU = torch.device("cpu")


def test_sampling_params_checks_as_vllm() -> None:
    sp = SamplingParams(logprob_token_ids=[3, 4])
    assert sp.num_logprobs == 2 and SamplingParams(logprobs=5).num_logprobs == 5
    sp.verify(vocab_size=10, max_logprobs=20)
    with pytest.raises(InvalidArgumentError, match=r"token_id\(s\) \[10\] in "
                       r"logprob_token_ids contain out-of-vocab token ids\. Vocabulary size: 10"):
        SamplingParams(logprob_token_ids=[3, 10]).verify(10, 20)
    with pytest.raises(InvalidArgumentError, match="Requested logprob_token_ids of length "
                       "129, which is greater than max allowed: 128"):
        SamplingParams(logprob_token_ids=list(range(129))).verify(1000, 20)
    with pytest.raises(InvalidArgumentError, match=r"logprobs must equal "
                       r"len\(logprob_token_ids\)\. Got logprobs=3, len\(logprob_token_ids\)=2"):
        SamplingParams(logprobs=3, logprob_token_ids=[1, 2]).verify(10, 20)
    with pytest.raises(InvalidArgumentError, match="logprob_token_ids"):
        SamplingParams(logprob_token_ids=["a"])


def test_sampler_mixes_explicit_rows_with_top_k_rows() -> None:
    torch.manual_seed(0)
    vocab = 40
    logits = torch.randn(3, vocab)
    want = torch.log_softmax(logits, -1)
    sps = [SamplingParams(temperature=0.0, logprob_token_ids=[5, 17, 30],
                          allowed_token_ids=[2]),
           SamplingParams(temperature=0.0, logprobs=4),
           SamplingParams(temperature=0.0, logprob_token_ids=[9])]
    md = build_sampling_metadata(sps, [[1], [1], [1]], [1, 1, 1], {}, vocab, CPU)
    out = Sampler()(logits.clone(), md)
    assert out.sampled_token_ids.tolist()[0] == 2  # allowed_token_ids still applies
    ids, lps = out.logprobs_tensors.logprob_token_ids, out.logprobs_tensors.logprobs
    assert ids[0, :4].tolist() == [2, 5, 17, 30]
    torch.testing.assert_close(lps[0, :4], want[0, [2, 5, 17, 30]])  # raw: unmasked
    assert ids[1, 1:5].tolist() == want[1].topk(4).indices.tolist()
    assert ids[2, :2].tolist() == [int(want[2].argmax()), 9]
    torch.testing.assert_close(lps[2, 1], want[2, 9])


@pytest.fixture(scope="module")
def client(model_path):
    engine = LLMEngine.from_config(EngineConfig(
        model=model_path, device="cpu", max_model_len=512, max_num_seqs=4, max_logprobs=-1))
    llm = AsyncLLM(engine)
    yield llm
    llm.shutdown()


def _chat(client, **body):
    body = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2,
            "temperature": 0, "logprobs": True, "return_tokens_as_token_ids": True, **body}
    res = handle_openai_request(client, "POST", "/v1/chat/completions", json.dumps(body),
                                served_model_name="smol")
    if res.stream is None:
        return res.status, json.loads(res.body)
    chunks = []
    while (chunk := res.stream.get(120)) != "":
        chunks.append(json.loads(chunk))
    return res.status, chunks


def _ids(entries) -> list[int]:
    return [int(e["token"].removeprefix("token_id:")) for e in entries]


@pytest.mark.parametrize("requested,top,sampled", [
    ([500], 5, 42), ([100, 1000, 5000], 3, 42), ([100, 1000, 5000], 3, 5000)])
def test_chat_returns_the_requested_ids_and_the_sampled_one(client, requested, top, sampled):
    status, out = _chat(client, top_logprobs=top, logprob_token_ids=requested,
                        allowed_token_ids=[sampled])
    assert status == 200, out
    first = out["choices"][0]["logprobs"]["content"][0]
    assert int(first["token"].removeprefix("token_id:")) == sampled
    returned = _ids(first["top_logprobs"])
    assert set(returned) == {*requested, sampled} and len(returned) == len(set(returned))
    assert all(math.isfinite(e["logprob"]) and e["logprob"] > -9999 for e in
               first["top_logprobs"])
    status, full = _chat(client, top_logprobs=-1, allowed_token_ids=[sampled])
    want = {int(e["token"].removeprefix("token_id:")): e["logprob"]
            for e in full["choices"][0]["logprobs"]["content"][0]["top_logprobs"]}
    for e in first["top_logprobs"]:
        assert e["logprob"] == pytest.approx(want[int(e["token"][9:])], abs=1e-4)


def test_streamed_with_no_top_k(client):
    status, chunks = _chat(client, stream=True, logprob_token_ids=[500],
                           allowed_token_ids=[42], max_tokens=1)
    assert status == 200
    returned = [t for c in chunks if c["choices"] and c["choices"][0].get("logprobs")
                for content in c["choices"][0]["logprobs"]["content"]
                for t in _ids(content["top_logprobs"])]
    assert set(returned) == {42, 500}


def test_completions_and_the_default_path(client):
    body = {"prompt": "Hello", "max_tokens": 1, "temperature": 0, "logprobs": 2,
            "logprob_token_ids": [7, 8], "return_tokens_as_token_ids": True}
    res = handle_openai_request(client, "POST", "/v1/completions", json.dumps(body),
                                served_model_name="smol")
    assert res.status == 200, res.body
    (top,) = json.loads(res.body)["choices"][0]["logprobs"]["top_logprobs"]
    sampled = json.loads(res.body)["choices"][0]["logprobs"]["tokens"][0]
    assert set(top) == {"token_id:7", "token_id:8", sampled}
    status, out = _chat(client, top_logprobs=2)  # without the field: the natural top-k
    assert status == 200 and len(out["choices"][0]["logprobs"]["content"][0][
        "top_logprobs"]) == 2


@pytest.mark.parametrize("body,message", [
    ({"use_beam_search": True, "n": 1}, "not supported with beam search"),
    ({"logprobs": False}, "`logprobs` must be set to true"),
])
def test_refused_requests(client, body, message):
    status, out = _chat(client, logprob_token_ids=[5], **body)
    assert status == 400 and message in out["error"]["message"]


def test_the_ids_cross_to_an_engine_core_in_a_child(model_path):
    """The field travels with SamplingParams over the engine-core socket (msgpack)."""
    engine = LLMEngine.from_config(EngineConfig(model=model_path, max_model_len=256,
                                                multiprocessing=True))
    try:
        assert engine.is_multiprocess
        engine.add_request("a", "The capital of France is",
                           SamplingParams(temperature=0.0, max_tokens=2,
                                          logprob_token_ids=[11, 12]))
        done = []
        while engine.has_unfinished_requests():
            done += [o for o in engine.step() if o.finished]
        (out,) = done
        for step, tok in zip(out.outputs[0].logprobs, out.outputs[0].token_ids, strict=True):
            assert set(step) == {11, 12, tok}
    finally:
        engine.shutdown()
