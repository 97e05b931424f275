"""CUDA-graph modes, capture sizes and dispatch (CPU).

Ports vLLM 0.33 tests/v1/cudagraph/test_cudagraph_dispatch.py (TestCudagraphDispatcher:
keys per mode, dispatch of mixed / uniform / too-large batches, capture order) and the
capture-size derivation of vllm/config/vllm.py (_set_cudagraph_sizes), without the
piecewise and LoRA cases this engine does not have.
"""

from __future__ import annotations

import numpy as np
import pytest

from libvllm.engine.compilation_config import (
    CaptureSizes,
    CUDAGraphMode,
    cudagraph_capture_sizes,
    resolve_cudagraph_mode,
)
from libvllm.engine.config import EngineConfig
from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.resolved_config import DeviceFacts, batch_defaults, resolve_config
from libvllm.engine.worker.cudagraph_dispatcher import BatchDescriptor, CudagraphDispatcher
from libvllm.engine.worker.model_runner import _graph_rows

M = CUDAGraphMode


def _capture_sizes(**kwargs) -> CaptureSizes:
    """What the engine core hands capture_model for these flags (CPU batch defaults)."""
    return resolve_config(EngineConfig("m", **kwargs), 4096,
                          DeviceFacts("cpu")).compilation.capture_sizes()


@pytest.mark.parametrize("mode", ["FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"])
def test_dispatcher_keys_and_dispatch(mode):
    d = CudagraphDispatcher(M[mode], [1, 8], max_num_seqs=8)
    mixed, uniform = mode != "FULL_DECODE_ONLY", mode != "FULL"
    assert len(d.keys) == 2 * (mixed + uniform)
    # 1. a mixed batch of a captured size: a FULL graph only when mixed batches have one
    assert d.dispatch(8, uniform_decode=False) == (
        BatchDescriptor(8, 8, False) if mixed else None)
    # 2. a uniform decode batch: its own graph with a separate decode routine, else FULL's
    assert d.dispatch(8, uniform_decode=True) == BatchDescriptor(8, 8, uniform)
    # padded up to the next capture size
    assert d.dispatch(5, uniform_decode=True) == BatchDescriptor(8, 8, uniform)
    # 3. no key: larger than the largest size
    assert d.dispatch(15, uniform_decode=False) is None
    assert d.capture_descs()[0].num_tokens == 8  # largest first


def test_dispatcher_none_and_piecewise():
    assert CudagraphDispatcher(M.NONE, [1, 8], 8).dispatch(1, True) is None
    assert CudagraphDispatcher(M.FULL, [], 8).dispatch(1, True) is None
    with pytest.raises(InvalidArgumentError, match="PIECEWISE"):
        CudagraphDispatcher(M.PIECEWISE, [1, 8], 8)


def test_uniform_decode_past_max_num_seqs_takes_the_mixed_graph():
    """With both routines, a decode batch padded past the decode keys (capture sizes
    above max_num_seqs) replays the mixed graph of its size, as vLLM's dispatch falls
    back from a uniform to a general descriptor."""
    d = CudagraphDispatcher(M.FULL_AND_PIECEWISE, [1, 8, 16], max_num_seqs=12)
    assert d.dispatch(4, uniform_decode=True) == BatchDescriptor(8, 8, True)
    assert d.dispatch(10, uniform_decode=True) == BatchDescriptor(16, 12, False)
    assert {k.num_tokens for k in d.keys if k.uniform} == {1, 8}


def test_dispatch_num_reqs_capped_at_max_num_seqs():
    d = CudagraphDispatcher(M.FULL, [1, 2, 4, 8, 16, 24, 32], max_num_seqs=4)
    assert d.dispatch(17, uniform_decode=False) == BatchDescriptor(24, 4, False)
    d = CudagraphDispatcher(M.FULL_DECODE_ONLY, [1, 2, 4, 8, 16], max_num_seqs=4)
    assert {k.num_tokens for k in d.keys} == {1, 2, 4}  # decode keys up to max_num_seqs
    assert d.dispatch(3, uniform_decode=True) == BatchDescriptor(4, 4, True)
    assert d.dispatch(3, uniform_decode=False) is None


@pytest.mark.parametrize("num_tokens", [1, 3, 8, 9, 100, 255, 257, 512])
def test_padding_never_shrinks(num_tokens):
    sizes = cudagraph_capture_sizes(256, 8192)
    d = CudagraphDispatcher(M.FULL, sizes, 256)
    desc = d.dispatch(num_tokens, False)
    assert desc.num_tokens >= num_tokens and desc.num_tokens in sizes
    assert sizes[sizes.index(desc.num_tokens) - 1] < num_tokens or desc.num_tokens == 1
    # a graph's metadata rows: every request plus the padding tokens' own request
    assert _graph_rows(desc) >= min(num_tokens, 256) + 1


def test_modes_parse_and_resolve():
    assert M.parse(None) == M.FULL_AND_PIECEWISE  # vLLM's default
    assert M.parse("full_decode_only") == M.FULL_DECODE_ONLY
    with pytest.raises(InvalidArgumentError, match="cudagraph_mode"):
        M.parse("SOMETIMES")
    assert M.FULL_AND_PIECEWISE.decode_mode() == M.FULL
    assert M.FULL_AND_PIECEWISE.mixed_mode() == M.PIECEWISE
    assert M.FULL_DECODE_ONLY.mixed_mode() == M.NONE and M.FULL.mixed_mode() == M.FULL
    # no compilation here, but piecewise parts are captured as full graphs (not dropped
    # as vLLM's _normalize_piecewise_cudagraph_mode drops them)
    assert resolve_cudagraph_mode(M.FULL_AND_PIECEWISE, False) == M.FULL_AND_PIECEWISE
    assert resolve_cudagraph_mode(M.PIECEWISE, False) == M.FULL
    assert resolve_cudagraph_mode(M.FULL, False) == M.FULL
    assert resolve_cudagraph_mode(M.FULL_DECODE_ONLY, False) == M.FULL_DECODE_ONLY
    assert resolve_cudagraph_mode(M.FULL, True) == M.NONE  # enforce_eager


def test_capture_sizes_as_vllm_derives_them():
    # max_num_seqs 256: ceiling min(2 * 256, 512) = 512
    sizes = cudagraph_capture_sizes(256, 8192)
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[-3:] == [480, 496, 512]
    assert 248 in sizes and 256 in sizes and 272 in sizes and 264 not in sizes
    assert len(sizes) == 3 + 31 + 17
    # max_num_seqs 1024 (vLLM's H200 default): ceiling 1024 here (vLLM: 512; the
    # dispatcher's _DEFAULT_MAX_GRAPH_SIZE says why), decode graphs to max_num_seqs
    sizes = cudagraph_capture_sizes(1024, 8192)
    assert sizes[-3:] == [992, 1008, 1024] and len(sizes) == 3 + 31 + 49
    # max_num_seqs 64: ceiling 128; max_num_seqs itself is on the ladder
    assert cudagraph_capture_sizes(64, 8192) == [1, 2, 4, *range(8, 129, 8)]
    assert cudagraph_capture_sizes(20, 8192) == [1, 2, 4, 8, 16, 20, 24, 32, 40]
    # capped at max_num_batched_tokens, which is captured itself when it fits
    assert cudagraph_capture_sizes(256, 100) == [1, 2, 4, *range(8, 97, 8), 100]
    # given sizes: deduplicated, cut at max_num_batched_tokens
    assert cudagraph_capture_sizes(256, 8192, [4, 1, 4, 9999]) == [1, 4]
    assert cudagraph_capture_sizes(256, 8192, max_size=40) == [1, 2, 4, 8, 16, 24, 32, 40]
    with pytest.raises(InvalidArgumentError, match="consistent"):
        cudagraph_capture_sizes(256, 8192, [1, 8], max_size=16)


@pytest.mark.parametrize("name, memory, seqs", [
    ("NVIDIA H200", 140 << 30, 1024), ("NVIDIA H100 80GB HBM3", 80 << 30, 1024),
    ("NVIDIA A100-SXM4-80GB", 80 << 30, 256), ("NVIDIA L4", 23 << 30, 256),
    ("cpu", 0, 256),
], ids=["h200", "h100", "a100", "l4", "cpu"])
def test_batch_defaults(name, memory, seqs):
    """vLLM's get_batch_defaults (LLM class): 1024 requests and 16,384 tokens a step on
    >= 70 GiB GPUs other than the A100, else 256 and 8,192 (hybrid GDN models too: their
    state comes out of the block pool)."""
    assert batch_defaults(name, memory) == (seqs, 16384 if seqs == 1024 else 8192)


def test_engine_config_max_num_seqs_checked():
    assert EngineConfig("m").max_num_seqs is None  # derived by the engine core
    with pytest.raises(InvalidArgumentError, match="max_num_seqs must be >= 0, got -1"):
        EngineConfig("m", max_num_seqs=-1)


def test_engine_config_capture_sizes_and_mode():
    sizes = _capture_sizes(max_num_seqs=64, max_num_batched_tokens=8192)
    assert isinstance(sizes, CaptureSizes) and sizes.mode == M.FULL_AND_PIECEWISE  # default
    assert _capture_sizes(cudagraph_mode="FULL").mode == M.FULL  # one routine
    assert _capture_sizes(cudagraph_mode="PIECEWISE").mode == M.FULL
    assert sizes[-1] == 128
    assert _capture_sizes(cudagraph_mode="full").mode == M.FULL
    assert _capture_sizes(enforce_eager=True) == []
    assert _capture_sizes(cudagraph_mode="NONE") == []
    assert _capture_sizes(cudagraph_mode="FULL_DECODE_ONLY").mode == M.FULL_DECODE_ONLY
    with pytest.raises(InvalidArgumentError, match="cudagraph_mode"):
        EngineConfig("m", cudagraph_mode="ALWAYS")


def test_graph_rows_pad_query_start_loc_monotonic():
    """The runner's padding keeps query_start_loc non-decreasing (the kernel's search)."""
    desc = BatchDescriptor(16, 8, False)
    qsl = np.zeros(_graph_rows(desc) + 1, np.int64)
    qsl[1:4] = [5, 6, 11]  # 3 requests, 11 tokens
    qsl[4:] = 16  # request 3: the padding tokens 11..16; rows after it: none
    assert (np.diff(qsl) >= 0).all() and qsl[-1] == desc.num_tokens
