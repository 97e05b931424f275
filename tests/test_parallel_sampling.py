"""ParentRequest (n > 1) and its outputs through the OutputProcessor.

Mirrors vLLM 0.33 tests/v1/engine/test_parallel_sampling.py
(test_parent_request_to_output_stream, test_parent_request_to_output_final_only) and
the child request ids / seeds of vllm/v1/engine/parallel_sampling.py
(`{i}_{parent}`, seed + i); the per-step merge of sibling outputs mirrors
RequestOutput.add as vLLM's output collector applies it. The engine path is in
tests/test_sampling_e2e.py.
"""

from __future__ import annotations

import pytest

from libvllm.engine.engine_core.engine_core_messages import EngineCoreOutput
from libvllm.engine.gguf.reader import GGUFReader
from libvllm.engine.output_processor import OutputProcessor
from libvllm.engine.outputs import CompletionOutput
from libvllm.engine.parallel_sampling import ParentRequest
from libvllm.engine.request import Request, RequestStatus
from libvllm.engine.sampling_params import RequestOutputKind, SamplingParams
from libvllm.engine.tokenizer import Tokenizer


def _core_out(req, new_ids, new_logprobs=None, new_prompt_logprobs=None):
    """What the engine core reports for `req` (engine/engine_core/engine_core.py)."""
    return EngineCoreOutput(req.request_id, new_ids, new_logprobs, new_prompt_logprobs,
                            req.get_finished_reason(), req.stop_reason, req.num_cached_tokens)


def _completion(index: int) -> CompletionOutput:
    return CompletionOutput(index=index, text=f"child {index}", token_ids=[])


def test_parent_request_to_output_stream():
    parent = ParentRequest("parent_id", SamplingParams(n=2))
    parent.child_requests = {"child_id_0", "child_id_1"}
    out0, out1 = _completion(0), _completion(1)
    for _ in range(2):  # not finished
        assert parent.get_outputs("child_id_0", out0) == ([out0], False)
        assert parent.get_outputs("child_id_1", out1) == ([out1], False)
    out1.finish_reason = "ended"
    assert parent.get_outputs("child_id_0", out0) == ([out0], False)
    assert parent.get_outputs("child_id_1", out1) == ([out1], False)
    assert parent.get_outputs("child_id_0", out0) == ([out0], False)
    assert parent.get_outputs("child_id_1", out1) == ([], False)  # not returned twice
    out0.finish_reason = "ended"
    assert parent.get_outputs("child_id_0", out0) == ([out0], True)
    assert parent.get_outputs("child_id_1", out1) == ([], True)
    assert parent.get_outputs("child_id_0", out0) == ([], True)


def test_parent_request_to_output_final_only():
    parent = ParentRequest("parent_id", SamplingParams(
        n=2, output_kind=RequestOutputKind.FINAL_ONLY))
    parent.child_requests = {"child_id_0", "child_id_1"}
    out0, out1 = _completion(0), _completion(1)
    assert parent.get_outputs("child_id_0", out0) == ([], False)
    assert parent.get_outputs("child_id_1", out1) == ([], False)
    out1.finish_reason = "ended"
    assert parent.get_outputs("child_id_0", out0) == ([], False)
    assert parent.get_outputs("child_id_1", out1) == ([], False)
    out0.finish_reason = "ended"
    assert parent.get_outputs("child_id_0", out0) == ([out0, out1], True)
    assert parent.get_outputs("child_id_1", out1) == ([out0, out1], True)


@pytest.mark.parametrize("seed", [None, 10])
def test_child_ids_and_seeds(seed):
    parent = ParentRequest("p", SamplingParams(n=3, seed=seed, temperature=0.8))
    children = [parent.get_child_info(i) for i in range(3)]
    assert [rid for rid, _ in children] == ["0_p", "1_p", "2_p"]
    assert all(sp.n == 1 for _, sp in children)
    seeds = [sp.seed for _, sp in children]
    assert seeds == ([None] * 3 if seed is None else [10, 11, 12])
    assert parent.sampling_params.n == 3 and parent.sampling_params.seed == seed


@pytest.fixture(scope="module")
def tokenizer(model_path):
    with GGUFReader(model_path) as r:
        return Tokenizer.from_gguf_metadata(r.metadata)


def _children(op, kind, n=3):
    parent = ParentRequest("p", SamplingParams(n=n, output_kind=kind, max_tokens=2))
    reqs = []
    for i in range(n):
        rid, sp = parent.get_child_info(i)
        reqs.append(Request(rid, [1, 2, 3], sp, None, 0.0, 16))
        op.add_request(reqs[-1], "prompt", parent, i)
    return reqs


def _step(op, reqs, tokens, finish=False):
    outs = []
    for req, tok in zip(reqs, tokens):
        req.append_output_token_ids([tok])
        if finish:
            req.status = RequestStatus.FINISHED_LENGTH_CAPPED
        outs.append(_core_out(req, [tok]))
    return op.process_outputs(outs)[0]


@pytest.mark.parametrize("kind", [RequestOutputKind.CUMULATIVE, RequestOutputKind.DELTA])
def test_siblings_of_one_step_merge_into_one_output(tokenizer, kind):
    op = OutputProcessor(tokenizer)
    reqs = _children(op, kind)
    (out,) = _step(op, reqs, [10, 11, 12])
    assert out.request_id == "p" and not out.finished
    assert [(c.index, c.token_ids) for c in out.outputs] == [(0, [10]), (1, [11]), (2, [12])]
    (out,) = _step(op, reqs[1:], [21, 22], finish=True)  # child 0 idle this step
    want = [21] if kind == RequestOutputKind.DELTA else [11, 21]
    assert [c.index for c in out.outputs] == [1, 2] and out.outputs[0].token_ids == want
    assert not out.finished  # child 0 still runs
    (out,) = _step(op, reqs[:1], [20], finish=True)
    assert out.finished and [c.index for c in out.outputs] == [0]
    assert not op.request_states and not op.parent_requests


def test_final_only_returns_all_n_once(tokenizer):
    op = OutputProcessor(tokenizer)
    reqs = _children(op, RequestOutputKind.FINAL_ONLY)
    assert _step(op, reqs, [10, 11, 12]) == []
    assert _step(op, reqs[:2], [20, 21], finish=True) == []
    (out,) = _step(op, reqs[2:], [22], finish=True)
    assert out.finished and [c.token_ids for c in out.outputs] == [[10, 20], [11, 21], [12, 22]]


def test_abort_of_parent_reaches_every_live_child(tokenizer):
    op = OutputProcessor(tokenizer)
    reqs = _children(op, RequestOutputKind.CUMULATIVE)
    _step(op, reqs[:1], [10], finish=True)  # child 0 done
    assert op.child_request_ids("p") == ["1_p", "2_p"]
    (out,) = op.abort_requests([r.request_id for r in reqs[1:]])
    assert out.finished and [(c.index, c.finish_reason) for c in out.outputs] == \
        [(1, "abort"), (2, "abort")]
    assert not op.has_request("p") and op.child_request_ids("p") == []
