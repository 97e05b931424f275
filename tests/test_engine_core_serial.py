"""The engine-core wire format (engine/serial_utils.py, engine_core_messages.py).

Ports the ideas of vLLM 0.33 tests/v1/test_serial_utils.py: typed round trips of the
request and output structs, numpy arrays and tensors as raw buffers (large ones as
their own frame, zero-copy on decode), and no pickling: an arbitrary object is refused.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from libvllm.engine.engine_core.engine_core_messages import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    error_from_wire,
)
from libvllm.engine.errors import ModelLoadError, VllmError
from libvllm.engine.metrics import PrefixCacheStats, SchedulerStats
from libvllm.engine.sample.outputs import LogprobsLists
from libvllm.engine.sampling_params import RequestOutputKind, SamplingParams
from libvllm.engine.serial_utils import MsgpackDecoder, MsgpackEncoder
from libvllm.engine.structured_output.params import StructuredOutputsParams


def _round_trip(obj, t=None):
    frames = MsgpackEncoder().encode(obj)
    return MsgpackDecoder(t).decode(frames), frames


def test_request_round_trip_keeps_the_completed_params():
    sp = SamplingParams(n=2, temperature=0.7, stop=["\n"], logit_bias={5: -1.5}, seed=3,
                        output_kind=RequestOutputKind.DELTA,
                        structured_outputs=StructuredOutputsParams(regex="a+"))
    sp._eos_token_id, sp._all_stop_token_ids, sp._bad_words_token_ids = 2, {2, 7}, [[9]]
    sp.structured_outputs._backend = "xgrammar"
    req = EngineCoreRequest("r-1", [1, 2, 3], sp, 123.5, priority=-1, cache_salt="s",
                            reasoning_parser_kwargs={"enable_thinking": False})
    got, frames = _round_trip(req, EngineCoreRequest)
    assert len(frames) == 1 and got == req
    assert got.sampling_params._all_stop_token_ids == {2, 7}
    assert got.sampling_params.output_kind is RequestOutputKind.DELTA
    assert got.sampling_params.structured_outputs._backend == "xgrammar"


def test_outputs_round_trip():
    lp = LogprobsLists([[4, 1]], [[-0.1, -2.0]], [1])
    outs = EngineCoreOutputs(
        [EngineCoreOutput("a", [4], lp, None, "stop", 4, 16),
         EngineCoreOutput("b", [], finish_reason="error", error=(3, "bad grammar"))],
        SchedulerStats(2, 1, kv_cache_usage=0.5,
                       prefix_cache_stats=PrefixCacheStats(requests=1, queries=32, hits=16)),
        num_preemptions=4)
    got, _ = _round_trip(outs, EngineCoreOutputs)
    assert got == outs and isinstance(got.outputs[0].new_logprobs, LogprobsLists)
    assert got.scheduler_stats.prefix_cache_stats.hits == 16
    exc = error_from_wire(got.outputs[1].error)
    assert isinstance(exc, ModelLoadError) and exc.status == 3 and str(exc) == "bad grammar"


@pytest.mark.parametrize("size", [3, 1000])
def test_arrays_travel_as_raw_buffers(size):
    arr = np.arange(size, dtype=np.int32).reshape(-1, 1)
    ten = torch.arange(size, dtype=torch.bfloat16)
    (got_arr, got_ten), frames = _round_trip([arr, ten])
    assert len(frames) == (1 if size == 3 else 3)  # large buffers: their own frames
    np.testing.assert_array_equal(got_arr, arr)
    assert got_arr.dtype == np.int32 and torch.equal(got_ten, ten)


def test_unknown_objects_are_refused_not_pickled():
    class Opaque:
        pass

    with pytest.raises(TypeError, match="cannot cross"):
        MsgpackEncoder().encode({"x": Opaque()})
    with pytest.raises(TypeError, match="cannot cross"):
        MsgpackEncoder().encode(np.array([object()], dtype=object))


def test_status_without_a_class_stays_a_vllm_error():
    exc = error_from_wire((9, "boom"))
    assert type(exc) is VllmError and exc.status == 9
