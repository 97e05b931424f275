"""engine/session/: the engine session driven from Python, no C library: what the C ABI
gets (counters, per-request timings, output routing by thread, model info,
parse_special, chat-template resolution) a Python user gets too.

Ours: vLLM's LLM (vllm/entrypoints/llm.py) keeps its counters and metrics engine-side
the same way; tests/v1/engine/test_llm_engine.py checks its stats from Python. The
router tests use hand-built RequestOutputs (no model).
"""

from __future__ import annotations

import threading

import pytest

from libvllm.engine.outputs import CompletionOutput, RequestOutput
from libvllm.engine.session import (
    EngineConfig,
    EngineSession,
    InvalidArgumentError,
    InvalidStateError,
    LoadCancelledError,
    SamplingParams,
)
from libvllm.engine.session.request_times import RequestTimes
from libvllm.engine.session.routing import OutputRouter


def _output(rid: str, token_ids: list[int], finished: bool) -> RequestOutput:
    completion = CompletionOutput(index=0, text="x", token_ids=token_ids, cumulative_logprob=None,
                                  logprobs=None, finish_reason="stop" if finished else None)
    return RequestOutput(request_id=rid, prompt="p", prompt_token_ids=[1, 2],
                         outputs=[completion], finished=finished)


def test_router_sends_each_output_to_the_adding_thread():
    router = OutputRouter()
    router.added("a", RequestTimes(), thread=1)
    router.added("b", RequestTimes(), thread=2)
    router.route([_output("a", [5], False), _output("b", [6, 7], True)])
    mine = router.take(2)
    assert [(o.result.request_id, o.num_output_tokens, o.last) for o in mine] == [
        ("b", 2, True)]
    assert "b" not in router.requests and "a" in router.requests  # b's owner took its last
    with pytest.raises(InvalidArgumentError, match="already in use"):
        router.check_new("a")
    assert [o.result.request_id for o in router.take(1)] == ["a"]
    assert router.take(1) == []


def test_router_keeps_a_finished_request_until_its_owner_takes_it():
    router = OutputRouter()
    router.added("a", RequestTimes(), thread=1)
    router.route([_output("a", [5], True)])
    router.take(2)  # another thread's step
    assert "a" in router.requests  # still counted, its id still in use
    assert router.take(1)[0].last


@pytest.fixture(scope="module")
def session(model_path):
    s = EngineSession.create(EngineConfig(model=model_path, max_model_len=256))
    yield s
    s.shutdown()


def _run(session: EngineSession, rid: str, max_tokens: int = 4) -> list:
    session.add_request(rid, "The capital of France is",
                        SamplingParams(max_tokens=max_tokens, temperature=0.0))
    outputs = []
    while not (outputs and outputs[-1].last):
        outputs += session.step()
    return outputs


def test_caller_driven_step_feeds_counters_and_timings(session):
    before = session.metrics()
    outputs = _run(session, "count", max_tokens=4)
    after = session.metrics()
    assert outputs[-1].num_output_tokens == 4
    assert after["generation_tokens"] - before["generation_tokens"] == 4
    assert after["prompt_tokens"] - before["prompt_tokens"] == len(
        outputs[0].result.prompt_token_ids)
    assert after["request_success"]["length"] - before["request_success"]["length"] == 1
    times = outputs[-1].times
    assert 0.0 < times.first_token_latency[0] <= times.e2e_latency()
    assert session.num_unfinished() == 0


def test_a_thread_that_added_nothing_is_told_where_outputs_go(session):
    session.add_request("other", "Hello", SamplingParams(max_tokens=2, temperature=0.0))
    stepped: list = []
    error: list = []

    def foreign() -> None:
        try:
            while True:
                stepped.extend(session.step())
        except InvalidStateError as e:
            error.append(e)

    t = threading.Thread(target=foreign)
    t.start()
    t.join(120)
    assert stepped == [] and "added by other threads" in str(error[0])
    assert session.num_unfinished() == 1  # its last output waits for this thread
    assert [o.last for o in session.step()][-1]
    assert session.num_unfinished() == 0


def test_parse_special_and_pieces(session):
    marker = "<|im_start|>"
    assert len(session.tokenize(marker, add_special=False, parse_special=True)) == 1
    assert len(session.tokenize(marker, add_special=False, parse_special=False)) > 1
    (token,) = session.tokenize(marker, add_special=False, parse_special=True)
    assert session.token_to_piece(token, special=False) == b""
    assert session.token_to_piece(token, special=True) == marker.encode()


def test_model_info_comes_from_the_engine(session):
    info = session.model_info()
    assert info.architecture == session.engine.model_info.architecture
    assert info.kv_capacity_tokens == (session.engine.engine_core.ready.num_gpu_blocks
                                       * session.engine.engine_core.ready.config.cache.block_size)
    assert info.n_layers > 0 and info.n_params > 0
    assert info.eos_token_id in info.eog_token_ids
    assert session.model_metadata()["general.architecture"] == "llama"


def test_loop_mode_refuses_caller_driven_calls(model_path):
    s = EngineSession.create(EngineConfig(model=model_path, max_model_len=256))
    try:
        loop = s.start_loop()
        assert s.start_loop() is loop
        with pytest.raises(InvalidStateError, match="background loop runs"):
            s.step()
        request = s.submit("r", "Hi", SamplingParams(max_tokens=2, temperature=0.0))
        while not request.stream.get(60).finished:
            pass
        assert s.num_unfinished() == 1  # pulled: its last output counts until taken
        request.last_event_taken()
        assert s.num_unfinished() == 0
        assert s.metrics()["generation_tokens"] == 2
    finally:
        s.shutdown()


def test_chat_template_resolution_and_abort(model_path, tmp_path):
    with pytest.raises(InvalidArgumentError, match="looks like a file path"):
        EngineSession.create(EngineConfig(model=model_path), chat_template="no/such.jinja")
    seen: list[float] = []

    def stop_at_start(fraction: float) -> bool:
        seen.append(fraction)
        return False

    with pytest.raises(LoadCancelledError, match="returned 0 at 0"):
        EngineSession.create(EngineConfig(model=model_path), progress=stop_at_start)
    assert seen == [0.0]


def test_no_tokenizer_is_an_invalid_state_for_every_tokenizer_call(model_path):
    s = EngineSession.create(EngineConfig(model=model_path, max_model_len=256,
                                          skip_tokenizer_init=True))
    try:
        for call in (lambda: s.tokenize("a", add_special=False, parse_special=True),
                     lambda: s.detokenize([1], skip_special_tokens=True),
                     lambda: s.token_to_piece(1, special=True)):
            with pytest.raises(InvalidStateError, match="skip_tokenizer_init"):
                call()
    finally:
        s.shutdown()
