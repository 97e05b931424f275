"""A stream whose consumer lags merges DELTA outputs, as vLLM's RequestOutputCollector.

Ported from vLLM 0.33 tests/v1/engine/test_output_processor.py
(test_request_output_collector, test_cumulative_output_collector_n) onto
engine/async_llm.py RequestStream: put then get returns one output; several puts before a
get return one merged output (text and token ids concatenated, logprobs extended, the last
cumulative logprob and finish reason, finished once the last one is); completions of n > 1
merge by index; an error after pending outputs is raised after them.
"""

from __future__ import annotations

import pytest

from libvllm.engine.async_llm import RequestStream
from libvllm.engine.outputs import CompletionOutput, RequestOutput

NUM_REQS = 3
TEXT = "a"


def make_outputs() -> list[RequestOutput]:
    return [RequestOutput(
        request_id="my-request-id", prompt=None, prompt_token_ids=[1, 2, 3],
        outputs=[CompletionOutput(
            index=0, text=TEXT, token_ids=[idx], cumulative_logprob=idx + 1.0,
            logprobs=[{idx: idx}], finish_reason="length" if idx == NUM_REQS - 1 else None)],
        finished=idx == NUM_REQS - 1) for idx in range(NUM_REQS)]


def stream() -> RequestStream:
    return RequestStream("my-request-id", cancel=lambda _: None)


def test_put_then_get() -> None:
    s = stream()
    s._put(make_outputs()[0])
    out = s.get(0)
    assert out.outputs[0].text == "a" and out.outputs[0].token_ids == [0]
    assert s.get(0) is None  # nothing pending


@pytest.mark.parametrize("num_to_put", [2, NUM_REQS])
def test_puts_before_get_merge(num_to_put: int) -> None:
    s = stream()
    for out in make_outputs()[:num_to_put]:
        s._put(out)
    out = s.get(0)
    comp = out.outputs[0]
    assert comp.text == TEXT * num_to_put
    assert comp.token_ids == list(range(num_to_put))
    assert comp.logprobs == [{i: i} for i in range(num_to_put)]
    assert comp.cumulative_logprob == float(num_to_put)  # the last one
    assert out.finished == (num_to_put == NUM_REQS)
    assert comp.finish_reason == ("length" if num_to_put == NUM_REQS else None)
    if out.finished:
        with pytest.raises(EOFError):
            s.get(0)
    else:
        assert s.get(0) is None


def test_merge_by_index_for_n() -> None:
    s = stream()
    for tok in range(2):
        s._put(RequestOutput("r", None, [1], outputs=[
            CompletionOutput(index=0, text="a", token_ids=[tok]),
            CompletionOutput(index=1, text="b", token_ids=[10 + tok])]))
    out = s.get(0)
    assert [(c.index, c.text, c.token_ids) for c in out.outputs] == \
        [(0, "aa", [0, 1]), (1, "bb", [10, 11])]


def test_error_after_pending_outputs_comes_after_them() -> None:
    s = stream()
    s._put(make_outputs()[0])
    s._put(RuntimeError("engine dead"))
    s._put(make_outputs()[1])  # nothing merges into (or past) an error
    assert s.get(0).outputs[0].token_ids == [0]
    with pytest.raises(RuntimeError, match="engine dead"):
        s.get(0)


def test_a_taken_output_is_not_changed_by_later_puts() -> None:
    s = stream()
    outs = make_outputs()
    s._put(outs[0])
    first = s.get(0)
    s._put(outs[1])
    assert first.outputs[0].token_ids == [0] and s.get(0).outputs[0].token_ids == [1]
