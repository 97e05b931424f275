"""Mixed prefill/decode steps of hybrid GDN models under CUDA graphs: breakable graphs
whose GDN core runs eagerly on the step's own rows (engine/breakable_cudagraph.py,
engine/worker/cudagraph_runner.py), the capture and profile batches of the core
(engine/worker/mamba_utils.py), and graphed steps equal to eager ones.

Mirrors vLLM 0.33's breakable capture (vllm/compilation/breakable_cudagraph.py: segments
and eager breaks replayed in capture order, weak references to the break's tensors) and
tests/v1/cudagraph/test_cudagraph_dispatch.py's mocked-graph checks; the engine cases
compare graphed with eager greedy tokens as tests/test_hybrid_gdn_engine.py compares
decode graphs. On CPU the graphs are simulated (replay = the captured forward run again,
what a replay executes; tests/test_kernels_cudagraph_runner.py); on CUDA they are real.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from test_hybrid_gdn_engine import KERNEL_LAYERS, _engine, _run, _saved_model

from libvllm.engine.breakable_cudagraph import BreakableCapture, eager_break, weak_ref_tensor
from libvllm.engine.compilation_config import CUDAGraphMode
from libvllm.engine.layers import attention as attention_layer
from libvllm.engine.layers.gdn import GatedDeltaNetAttention
from libvllm.engine.worker.cudagraph import CudaGraphs
from libvllm.engine.worker.cudagraph_runner import eager_mixed_lens
from libvllm.engine.worker.mamba_utils import capture_lens, profile_gdn_core, profile_lens

pytest.importorskip("transformers")


class _FakeGraph:
    """Records capture_begin / capture_end into a shared log; replay logs its id."""

    log: list[str] = []
    count = 0

    def __init__(self) -> None:
        _FakeGraph.count += 1
        self.id = _FakeGraph.count

    def capture_begin(self, pool=None) -> None:
        self.log.append(f"begin{self.id}")

    def capture_end(self) -> None:
        self.log.append(f"end{self.id}")

    def replay(self) -> None:
        self.log.append(f"replay{self.id}")


def test_breakable_capture_segments_replay_in_capture_order():
    _FakeGraph.log, _FakeGraph.count = [], 0
    out = torch.zeros(2)
    calls = []

    def core(x: torch.Tensor, tag: str) -> None:
        calls.append(tag)
        x += 1

    with BreakableCapture(graph_cls=_FakeGraph) as cap:
        eager_break(core, out, "a")
        eager_break(core, out, "b")
    assert (cap.num_graphs, cap.num_eager_breaks) == (3, 2)
    assert _FakeGraph.log == ["begin1", "end1", "begin2", "end2", "begin3", "end3"]
    assert calls == ["a", "b"] and out.tolist() == [2.0, 2.0]  # the capture run
    _FakeGraph.log = []
    cap.replay()
    assert _FakeGraph.log == ["replay1", "replay2", "replay3"]
    assert calls == ["a", "b", "a", "b"] and out.tolist() == [4.0, 4.0]
    assert BreakableCapture.current() is None


def test_eager_break_outside_a_capture_calls_through():
    x = torch.zeros(1)
    eager_break(lambda t: t.add_(3), x)
    assert x.item() == 3.0
    with pytest.raises(RuntimeError, match="Nested"):
        with BreakableCapture(graph_cls=_FakeGraph), BreakableCapture(graph_cls=_FakeGraph):
            pass


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_weak_ref_tensor_aliases_without_owning():
    t = torch.arange(12, dtype=torch.bfloat16, device="cuda").view(3, 4)[:, 1:3]
    w = weak_ref_tensor(t)
    assert (w.data_ptr(), w.shape, w.stride(), w.dtype) == (t.data_ptr(), t.shape,
                                                             t.stride(), t.dtype)
    w.add_(1)
    assert torch.equal(t, w)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    del t
    assert torch.cuda.memory_allocated() < before  # w does not keep the block


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_breakable_capture_replays_segments_around_eager_calls():
    """Real graphs: z = (2x + k) * 3, with the `+ k` an eager break reading a host value
    at replay time; replays see new inputs in x and the new k."""
    x = torch.ones(8, device="cuda")
    k = {"v": 1.0}

    def add_k(y: torch.Tensor) -> None:
        y.add_(k["v"])

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), BreakableCapture(torch.cuda.graph_pool_handle()) as cap:
        y = x * 2
        eager_break(add_k, y)
        z = y * 3
    torch.cuda.current_stream().wait_stream(side)
    assert (cap.num_graphs, cap.num_eager_breaks) == (2, 1)
    x.fill_(5.0)
    k["v"] = 4.0
    cap.replay()
    assert torch.equal(z, torch.full_like(z, 42.0))


@pytest.mark.parametrize("n,lens", [(1, [1]), (2, [2]), (3, [1, 2]), (1024, [1, 1023])])
def test_capture_lens(n, lens):
    assert capture_lens(n) == lens


@pytest.mark.parametrize("n,reqs,lens", [
    (16384, 1024, [16] * 1024), (10, 4, [2, 2, 2, 4]), (3, 8, [1, 1, 1]), (1, 1024, [1])])
def test_profile_lens_is_vllm_dummy_batch(n, reqs, lens):
    assert profile_lens(n, reqs) == lens


@pytest.fixture(scope="module")
def hybrid_dir(tmp_path_factory):
    return _saved_model("qwen3_5", tmp_path_factory, 6, num_hidden_layers=KERNEL_LAYERS)


def test_profile_run_runs_the_gdn_core_on_a_scratch_state(hybrid_dir, monkeypatch):
    """The memory profile (no KV cache yet) runs each GDN layer's core through the
    chunked path on vLLM's dummy rows, then unbinds the scratch state."""
    engine = _engine(hybrid_dir[0])
    runner = engine.model_runner
    layers = [m for m in runner.model.modules() if isinstance(m, GatedDeltaNetAttention)]
    saved = [(layer.conv_state, layer.ssm_state) for layer in layers]
    for layer in layers:
        layer.conv_state = layer.ssm_state = None
    seen = []
    real = GatedDeltaNetAttention._forward_core
    monkeypatch.setattr(GatedDeltaNetAttention, "_forward_core", lambda self, x, b, a, md: (
        seen.append((x.shape[0], md.query_start_loc, md.chunked_prefill,
                     self.ssm_state.shape[0])), real(self, x, b, a, md))[1])
    runner.profile_run(10, sample=False)
    assert seen == [(10, [0, 2, 4, 6, 10], True, 1)] * len(layers)  # max_num_seqs 4
    assert all(layer.conv_state is None and layer.profile_metadata is None
               for layer in layers)
    with profile_gdn_core(runner.model, 0, 4, runner.device):
        assert all(layer.profile_metadata is None for layer in layers)
    for layer, (conv, ssm) in zip(layers, saved):
        layer.conv_state, layer.ssm_state = conv, ssm


def test_eager_mixed_step_compile_pass_batches(hybrid_dir, monkeypatch):
    """The start-up pass over eager mixed steps runs decode rows then prefill rows
    (eager_mixed_lens: a long one, or short ones), through attention's decode split and
    every GDN core, writing no KV (padding slots) and no request state (the null block
    only). Attention through its kernels (interpreted on CPU), which skip padding slots as
    on CUDA."""
    monkeypatch.setattr(attention_layer, "use_kernels", lambda q: True)
    engine = _engine(hybrid_dir[0], max_num_batched_tokens=16)
    runner = engine.model_runner
    pool = [layer.kv_cache[:, 1:].clone() for layer in runner.model.modules()
            if isinstance(layer, attention_layer.Attention)]
    ssm = [layer.ssm_state[1:].clone() for layer in runner.model.modules()
           if isinstance(layer, GatedDeltaNetAttention)]
    seen = []
    real = GatedDeltaNetAttention._forward_core
    monkeypatch.setattr(GatedDeltaNetAttention, "_forward_core", lambda self, x, b, a, md: (
        seen.append((md.query_start_loc, md.state_indices)), real(self, x, b, a, md))[1])
    runner._compile_eager_mixed_steps()
    lens = [[1, 15], [1, 1, 1, 1, 12], [1, 2], [1, 2, 2], [1, 2, 2, 2, 2], [1, 1, 1, 1, 2],
            [1, 1, 1, 1, 2, 2], [1, 1, 1, 1, 2, 2, 2, 2]]
    assert eager_mixed_lens(16) == lens
    qsl = [[0, *itertools.accumulate(r)] for r in lens]
    assert seen == [(q, [0] * (len(q) - 1)) for q in qsl for _ in ssm]
    kv = [layer.kv_cache for layer in runner.model.modules()
          if isinstance(layer, attention_layer.Attention)]
    assert all(torch.equal(a, b[:, 1:]) for a, b in zip(pool, kv))  # block 0: null
    assert all(torch.equal(a, layer.ssm_state[1:]) for a, layer in zip(ssm, [
        m for m in runner.model.modules() if isinstance(m, GatedDeltaNetAttention)]))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.usefixtures("in_process_core")
def test_cuda_profile_peak_holds_the_gdn_core(hybrid_dir, monkeypatch):
    """The profile run's peak at 1,024 tokens (4 rows of 256: 16 chunks) exceeds the one
    of a profile that skips the GDN core by at least the per-chunk solve scratch
    ([16, Hv, 64, 64] fp32), the largest of the chunked kernels' temporaries."""
    import contextlib

    from libvllm.engine.worker import model_runner

    engine = _engine(hybrid_dir[0], device="cuda", max_num_batched_tokens=1024,
                     max_model_len=512, kv_cache_memory_bytes=64 << 20)
    runner = engine.model_runner
    layer = next(m for m in runner.model.modules() if isinstance(m, GatedDeltaNetAttention))

    def peak() -> int:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        runner.profile_run(1024, sample=False)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base

    peak()  # compiles
    with_core = peak()
    monkeypatch.setattr(model_runner, "profile_gdn_core",
                        lambda *a: contextlib.nullcontext())
    without = peak()
    # the scratch, at least half of it new (the allocator reuses freed activation blocks
    # for the rest: 0.91x of it measured on an H100)
    assert with_core - without >= 16 * layer.num_v_heads * 64 * 64 * 4 // 2


class SimulatedGraphs(CudaGraphs):
    """Replay = the captured forward run again (what a CUDA graph replay executes; an
    eager break outside a capture calls through)."""

    def capture(self, forward):
        self._forward = forward
        self.replayed = []
        for desc in self.dispatcher.capture_descs():
            self._graphs[desc] = forward(desc)

    def replay(self, desc):
        self.replayed.append(desc)
        return self._forward(desc)


@pytest.mark.skipif(torch.cuda.is_available(), reason="simulates graphs on CPU tensors "
                    "through the Triton interpreter; on CUDA "
                    "test_cuda_mixed_graphs_equal_eager_and_compile_nothing runs real ones")
def test_simulated_breakable_graphs_equal_eager(hybrid_dir, monkeypatch):
    """Every step as a breakable graph (FULL on CPU: no separate decode routine), chunked
    prefill at 8 tokens a step: mixed steps pad to the bucket, the GDN core runs on the
    step's own rows from the step reference, and the greedy tokens equal eager ones."""
    monkeypatch.setattr(attention_layer, "use_kernels", lambda q: True)  # graph metadata
    path, prompts, _ = hybrid_dir
    prompts = [p[:12] for p in prompts[:3]]
    eager = _run(_engine(path, max_num_batched_tokens=8), prompts, max_tokens=4)
    engine = _engine(path, max_num_batched_tokens=8)
    runner = engine.model_runner
    graphs = runner.init_cudagraphs(SimulatedGraphs, CUDAGraphMode.FULL, [1, 2, 4, 8])
    cores: list[tuple[int, int]] = []  # (graph rows, rows of the step's GDN metadata)
    real = GatedDeltaNetAttention._core_into
    monkeypatch.setattr(GatedDeltaNetAttention, "_core_into", lambda self, x, b, a, c, ref: (
        cores.append((x.shape[0], ref.metadata[0].query_start_loc[-1])),
        real(self, x, b, a, c, ref))[1])
    assert all(map(graphs.breakable, graphs.dispatcher.capture_descs()))
    assert _run(engine, prompts, max_tokens=4) == eager
    assert graphs.replayed and all(not d.uniform for d in graphs.replayed)
    assert any(rows > n for rows, n in cores)  # padded graphs, the core on real rows
    assert runner.mamba.step_ref.metadata is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.usefixtures("in_process_core")
@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_mixed_graphs_equal_eager_and_compile_nothing(family, dtype, tmp_path_factory,
                                                           triton_compiles):
    """FULL_AND_PIECEWISE on a tiny hybrid (MoE or dense): decode steps replay full
    graphs, mixed steps breakable ones (prompts of up to 130 tokens in 128-token steps:
    chunked GDN rows inside graphs up to 128 tokens). The graphed run goes first, so its
    count is of what its start-up left uncompiled: no GDN or attention kernel compiles in
    it (the capture passes compile the mixed steps' GDN conv, chunked and recurrent
    variants, the eager pass those of eager steps; other kernels, the sampler's, compile
    in the profile run, which a fixed KV budget skips). In fp32 the tokens equal the eager
    engine's token for token (in bf16 the mixed graphs' unified attention over decode
    rows rounds unlike eager steps' decode kernel: not compared)."""
    path, _, _ = _saved_model(family, tmp_path_factory, 8)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 128, (n,), generator=g).tolist() for n in (100, 70, 9, 130)]
    kw = dict(device="cuda", dtype=dtype, max_model_len=256, max_num_batched_tokens=128,
              cudagraph_capture_sizes=[1, 2, 4, 8, 16, 32, 64, 128],
              kv_cache_memory_bytes=64 << 20)
    engine = _engine(path, **kw)
    runner = engine.model_runner
    graphs = runner.cudagraphs
    assert graphs.dispatcher.mode == CUDAGraphMode.FULL_AND_PIECEWISE
    assert graphs.num_breakable == 8  # one per mixed size; decode graphs are full
    replayed = []
    real = graphs.replay
    graphs.replay = lambda desc: (replayed.append(desc), real(desc))[1]
    triton_compiles.clear()
    got = _run(engine, prompts, max_tokens=8)
    covered = ("_conv_", "_chunk_", "_fused_recurrent", "rms_norm_gated", "paged_attention")
    names = [c.split("[", 1)[0] for c in triton_compiles]
    assert [n for n in names if any(k in n for k in covered) and "argmax" not in n] == []
    assert any(not d.uniform and d.num_tokens == 128 for d in replayed)
    assert any(d.uniform for d in replayed)
    assert runner.mamba.step_ref.metadata is None
    if dtype == "float32":
        assert got == _run(_engine(path, enforce_eager=True, **kw), prompts, max_tokens=8)
