"""repetition_detection: end a request whose output tail repeats an n-gram (vLLM 0.33
SamplingParams.repetition_detection, finish_reason "repetition").

Ports vLLM 0.33 tests/v1/core/test_repetition_detection.py (TestCheckSequenceRepetition and
TestRepetitionDetectionIntegration, with our Request constructor) and adds
RepetitionDetectionParams' validation messages (vllm/sampling_params.py), the engine end to
end, the OpenAI request field and the ABI counterpart
(tests/test_capi_sampling.py::test_repetition_fields_end_a_repeating_request).
Oracle: the upstream expectations; for the engine, allowed_token_ids=[t] makes every output
token t, a pattern of size 1 the detector must see at the min_count-th token.
"""

from __future__ import annotations

import json

import pytest

from libvllm.engine.async_llm import AsyncLLM
from libvllm.engine.config import EngineConfig
from libvllm.engine.core.sched_utils import check_sequence_repetition, check_stop
from libvllm.engine.entrypoints.openai.api import handle_openai_request
from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.llm_engine import LLMEngine
from libvllm.engine.request import Request, RequestStatus
from libvllm.engine.sampling_params import RepetitionDetectionParams, SamplingParams

RD = RepetitionDetectionParams


@pytest.mark.parametrize("tokens,params,found", [
    ([1, 2, 3, 1, 2, 3, 1, 2, 3], RD(3, 2, 3), True),  # simple
    ([1, 2, 3, 1, 2, 3], RD(3, 2, 3), False),  # below min_count
    ([1, 2, 1, 2, 1, 2, 1, 2], RD(5, 2, 4), True),  # two-token pattern
    ([1, 2, 3, 4, 5, 6, 7, 8, 9], RD(5, 2, 2), False),  # varied
    ([1, 2, 3, 1, 2, 3, 1, 2, 4], RD(3, 2, 3), False),  # partial
    ([], RD(3, 2, 2), False),  # empty
    ([1, 2, 1, 2, 1, 2], RD(), False),  # disabled: max_pattern_size 0
    ([1, 2, 1, 2], RD(), False),  # min_count < 2
    ([1, 2, 3, 4, 5, 6, 5, 6, 5, 6], RD(3, 2, 3), True),  # at the end
    ([1, 2, 3, 4, 5, 6, 7, 8] * 5, RD(10, 2, 3), True),  # large pattern
    ([7, 7, 7], RD(2, 0, 3), True),  # min_pattern_size 0 means 1
])
def test_check_sequence_repetition(tokens, params, found):
    assert check_sequence_repetition(tokens, params) is found


def _request(outputs: list[int], eos: int | None = None, **params) -> Request:
    request = Request("test", [1, 2, 3], SamplingParams(max_tokens=100, **params), eos, 0.0, 16)
    request.append_output_token_ids(outputs)
    return request


@pytest.mark.parametrize("outputs,params,status", [
    ([10, 20, 10, 20, 10, 20], RD(5, 2, 3), RequestStatus.FINISHED_REPETITION),
    ([10, 20, 10, 20, 10, 20], None, None),  # disabled
    ([10, 20, 30, 40, 50, 60], RD(5, 2, 3), None),  # no repetition
    ([10, 20, 30, 10, 20, 30], RD(3, 3, 2), RequestStatus.FINISHED_REPETITION),  # boundary
    ([7, 8, 9, 10] * 3, RD(5, 2, 3), RequestStatus.FINISHED_REPETITION),  # sizes tried
    ([10, 20, 10, 20, 10, 20], RD(5, 3, 3), None),  # min_pattern_size filters size 2
    ([10, 20, 10, 20, 10, 20], RD(5, 2, 5), None),  # high min_count
])
def test_check_stop(outputs, params, status):
    request = _request(outputs, repetition_detection=params)
    assert check_stop(request, max_model_len=1024) is (status is not None)
    if status is not None:
        assert request.status == status and request.get_finished_reason() == "repetition"
        assert request.stop_reason == "repetition_detected"


def test_check_stop_order():
    """min_tokens defers the check; a stop token and the length cap win."""
    params = RD(5, 2, 3)
    assert not check_stop(_request([10, 20] * 3, min_tokens=10, repetition_detection=params),
                          1024)
    request = _request([10, 20, 10, 20, 999], stop_token_ids=[999],
                       repetition_detection=params)
    assert check_stop(request, 1024) and request.status == RequestStatus.FINISHED_STOPPED
    request = _request([10, 20] * 3, repetition_detection=params)
    assert check_stop(request, 9) and request.status == RequestStatus.FINISHED_LENGTH_CAPPED


def test_params_validation_as_vllm():
    with pytest.raises(InvalidArgumentError, match=r"max_pattern_size, min_pattern_size must "
                       r"be >=0, with min_pattern_size <= max_pattern_size\. Set both to 0 to "
                       r"disable repetitive pattern detection\."):
        RD(max_pattern_size=2, min_pattern_size=3, min_count=2)
    with pytest.raises(InvalidArgumentError, match="max_pattern_size, min_pattern_size"):
        RD(max_pattern_size=-1)
    with pytest.raises(InvalidArgumentError, match=r"min_count must be >= 2 to detect "
                       r"repetitive patterns in engine output\. If you do not wish to detect "
                       r"repetitive patterns, set max_pattern_size to 0\."):
        RD(max_pattern_size=3, min_count=1)
    with pytest.raises(InvalidArgumentError, match="min_count"):
        RD(max_pattern_size=3, min_count="3")
    assert SamplingParams.from_optional(repetition_detection={
        "max_pattern_size": 2, "min_count": 3}).repetition_detection == RD(2, 0, 3)
    with pytest.raises(InvalidArgumentError, match="repetition_detection must be an object"):
        SamplingParams.from_optional(repetition_detection=[2, 0, 3])
    with pytest.raises(InvalidArgumentError, match="repetition_detection"):
        SamplingParams(repetition_detection=[2, 0, 3])


@pytest.fixture(scope="module")
def client(model_path):
    engine = LLMEngine.from_config(EngineConfig(
        model=model_path, device="cpu", max_model_len=512, max_num_seqs=4))
    llm = AsyncLLM(engine)
    yield llm
    llm.shutdown()


def _generate(client, request_id: str, sp: SamplingParams):
    """The request's token ids, finish reason and stop reason (its DELTA outputs joined)."""
    stream = client.add_request(request_id, "Hello", sp)
    tokens = []
    while True:
        out = stream.get(120)
        tokens += out.outputs[0].token_ids
        if out.finished:
            return tokens, out.outputs[0].finish_reason, out.outputs[0].stop_reason


def test_engine_ends_a_repeating_output(client):
    """Every token is 42 (allowed_token_ids): size-1 pattern, min_count 4 -> 4 tokens."""
    sp = SamplingParams(temperature=0, max_tokens=20, allowed_token_ids=[42],
                        repetition_detection=RD(max_pattern_size=3, min_count=4))
    assert _generate(client, "rep", sp) == ([42] * 4, "repetition", "repetition_detected")
    sp = SamplingParams(temperature=0, max_tokens=6, allowed_token_ids=[42])
    assert _generate(client, "len", sp) == ([42] * 6, "length", None)


def _post(client, path: str, body: dict):
    res = handle_openai_request(client, "POST", path, json.dumps(body),
                                served_model_name="smol")
    return res.status, json.loads(res.body)


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "Hello"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hello"}]}),
])
def test_openai_field(client, path, body):
    body = {**body, "max_tokens": 20, "temperature": 0, "allowed_token_ids": [42],
            "repetition_detection": {"max_pattern_size": 2, "min_count": 3,
                                     "unknown": 1}}
    status, out = _post(client, path, body)
    assert status == 200, out
    choice = out["choices"][0]
    assert choice["finish_reason"] == "repetition"
    assert choice["stop_reason"] == "repetition_detected"
    assert out["usage"]["completion_tokens"] == 3
    status, out = _post(client, path, {**body, "repetition_detection": {
        "max_pattern_size": 2, "min_count": 1}})
    assert status == 400 and "min_count must be >= 2" in out["error"]["message"]
    status, out = _post(client, path, {**body, "repetition_detection": {
        "max_pattern_size": "x", "min_count": 3}})
    assert status == 400 and "max_pattern_size" in out["error"]["message"]


def test_metrics_count_repetition(client):
    sp = SamplingParams(temperature=0, max_tokens=20, allowed_token_ids=[42],
                        repetition_detection=RD(max_pattern_size=1, min_count=2))
    before = client.get_stats()["request_success"].get("repetition", 0)
    assert _generate(client, "metric", sp)[1] == "repetition"
    assert client.get_stats()["request_success"]["repetition"] == before + 1


def test_the_params_cross_to_an_engine_core_in_a_child(model_path):
    """The nested dataclass travels with SamplingParams over the engine-core socket."""
    engine = LLMEngine.from_config(EngineConfig(model=model_path, max_model_len=256,
                                                multiprocessing=True))
    try:
        assert engine.is_multiprocess
        engine.add_request("a", "Hello", SamplingParams(
            temperature=0.0, max_tokens=10, allowed_token_ids=[42],
            repetition_detection=RD(max_pattern_size=1, min_count=3)))
        done = []
        while engine.has_unfinished_requests():
            done += [o for o in engine.step() if o.finished]
        (out,) = done
        assert out.outputs[0].token_ids == [42] * 3
        assert out.outputs[0].finish_reason == "repetition"
    finally:
        engine.shutdown()


@pytest.mark.parametrize("extra", [{"max_tokens": 3}, {"max_tokens": 20, "repetition_detection":
                                                       RD(max_pattern_size=1, min_count=3)}],
                         ids=["length", "repetition"])
def test_a_stop_string_on_the_last_token_wins(client, extra):
    """vLLM's output processor: a stop string completed by the token that also ended the
    request in the engine (length, repetition) makes it "stop" with that string."""
    text = client.engine.tokenizer.decode([42])
    sp = SamplingParams(temperature=0, allowed_token_ids=[42], stop=[text * 3], **extra)
    tokens, reason, stop_reason = _generate(client, f"stop-{len(extra)}", sp)
    assert (len(tokens), reason, stop_reason) == (3, "stop", text * 3)
