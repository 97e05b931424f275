"""Hybrid GDN models through LLMEngine (CPU): the same prompts batched, alone, with
chunked prefill (chunks smaller than a prompt) and under preemption give transformers'
greedy tokens; state blocks return to the block pool after finish, abort and preemption.

Mirrors vLLM 0.33 tests/models/language/generation/test_hybrid.py (batching, chunked
prefill) and tests/v1/core/test_single_type_kv_cache_manager.py (test_mamba_* freeing)
on the tiny random Qwen3-Next / Qwen3.5 models of test_models_hybrid_gdn.py. With prefix
caching off the state is vLLM's mamba_cache_mode "none"; with it on, "align" mode
(engine/core/mamba_align.py): hits come from saved GDN state blocks (vLLM
tests/v1/core/test_prefix_caching.py test_prefill_hybrid_model_mamba_align and
tests/v1/e2e/general/test_mamba_prefix_cache.py: same tokens, cache hits counted).
The tiny models' state page (3,200 bytes in fp32) raises the attention block size from 8
to 16 tokens (a 4,096-byte page: 16 tokens x 2 kv heads x 16 x 2 x 4 bytes), so hits come
in 16-token blocks.
"""

from __future__ import annotations

import pytest
import torch
from test_models_hybrid_gdn import make_hf_model

from libvllm.engine.config import EngineConfig
from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.llm_engine import LLMEngine
from libvllm.engine.sampling_params import SamplingParams

pytest.importorskip("transformers")

MAX_TOKENS = 12
# the interpreted-kernel tests: decodes and mixed steps at a third of the tokens, on the
# first 4 layers (3 GDN layers and a full-attention one: every layer kind, half the kernel
# calls of the 8 layers)
KERNEL_TOKENS = 4
KERNEL_LAYERS = 4
LENS = (21, 9, 30, 14)


def _saved_model(family: str, tmp_path_factory, max_tokens: int = MAX_TOKENS, **overrides):
    """(path, prompts, transformers' greedy tokens of each prompt)."""
    hf = make_hf_model(family, **overrides)
    path = tmp_path_factory.mktemp(family)
    hf.save_pretrained(path)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 128, (n,), generator=g).tolist() for n in LENS]
    with torch.no_grad():
        ref = [_hf_greedy(hf, p, max_tokens) for p in prompts]
    return str(path), prompts, ref


@pytest.fixture(scope="module", params=["qwen3_next", "qwen3_5"])
def model_dir(request, tmp_path_factory):
    return _saved_model(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def kernel_model_dir(tmp_path_factory):
    """Qwen3.5 at KERNEL_LAYERS layers, for the tests of the interpreted kernels."""
    return _saved_model("qwen3_5", tmp_path_factory, KERNEL_TOKENS,
                        num_hidden_layers=KERNEL_LAYERS)


def _hf_greedy(hf, prompt: list[int], max_tokens: int = MAX_TOKENS) -> list[int]:
    t = torch.tensor([prompt])  # an explicit mask: token 0 is the pad id
    out = hf.generate(t, attention_mask=torch.ones_like(t), max_new_tokens=max_tokens,
                      do_sample=False)
    return out[0, len(prompt):].tolist()


def _engine(path: str, **kw) -> LLMEngine:
    cfg = dict(model=path, device="cpu", max_model_len=64, enable_prefix_caching=False,
               skip_tokenizer_init=True, block_size=8, max_num_seqs=4,
               multiprocessing=False)  # the tests look inside the core (runner, scheduler)
    return LLMEngine.from_config(EngineConfig(**{**cfg, **kw}))


def _run(engine: LLMEngine, prompts: list[list[int]], cached: list[int] | None = None,
         max_tokens: int = MAX_TOKENS) -> list[list[int]]:
    """Greedy tokens per prompt; `cached` (if given) receives each one's cached tokens."""
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, sp)
    out: dict[str, list[int]] = {}
    hits: dict[str, int] = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                out[o.request_id] = list(o.outputs[0].token_ids)
                hits[o.request_id] = o.num_cached_tokens
    if cached is not None:
        cached[:] = [hits[f"r{i}"] for i in range(len(prompts))]
    return [out[f"r{i}"] for i in range(len(prompts))]


def _assert_slots_back(engine: LLMEngine, prompt: list[int]) -> None:
    """Run one more request to its end; then no request holds a state block, every block
    but the null one is free (prefix caching off), and the runner, which hears of
    finished requests with the next step, knows at most that last one."""
    engine.add_request("last", prompt, SamplingParams(temperature=0.0, max_tokens=2))
    while engine.has_unfinished_requests():
        engine.step()
    kv = engine.scheduler.kv_cache_manager
    assert len(kv.mamba_managers) == 3  # 6 GDN layers in groups of 2 (2 attention layers)
    assert all(not m.req_to_block for m in kv.mamba_managers)
    assert kv.block_pool.get_num_free_blocks() == kv.block_pool.num_gpu_blocks - 1
    assert set(engine.model_runner.mamba.blocks_of) <= {"last"}


def test_batched_and_alone_match_transformers(model_dir):
    path, prompts, ref = model_dir
    engine = _engine(path)
    assert _run(engine, prompts) == ref
    assert [_run(engine, [p])[0] for p in prompts[:2]] == ref[:2]
    _assert_slots_back(engine, prompts[1])


def test_chunked_prefill_matches(model_dir):
    path, prompts, ref = model_dir
    assert _run(_engine(path, max_num_batched_tokens=8), prompts) == ref


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_preemption_matches_and_frees_state(model_dir, async_scheduling):
    """Preemption (recompute) with chunked prefill; also under async scheduling, where a
    freed slot is handed out while the step before is still queued."""
    path, prompts, ref = model_dir
    block_bytes = 2 * 4096  # a block id: one 4,096-byte page in each of the 2 buffers
    engine = _engine(path, kv_cache_memory_bytes=10 * block_bytes,
                     async_scheduling=async_scheduling, max_num_batched_tokens=8)
    assert _run(engine, prompts) == ref
    assert engine.scheduler.num_preemptions > 0
    _assert_slots_back(engine, prompts[1])


def test_abort_frees_state(model_dir):
    path, prompts, _ = model_dir
    engine = _engine(path)
    engine.add_request("a", prompts[0], SamplingParams(temperature=0.0, max_tokens=50))
    engine.step()
    assert "a" in engine.model_runner.mamba.blocks_of
    assert all("a" in m.req_to_block for m in engine.scheduler.kv_cache_manager.mamba_managers)
    engine.abort_request("a")
    _assert_slots_back(engine, prompts[1])


def test_prefix_caching_align_mode_hits_and_matches(model_dir):
    path, prompts, ref = model_dir
    pool = 64 * 2 * 4096  # 64 blocks: the 4 prompts' saved states outlive the run
    engine = _engine(path, enable_prefix_caching=True, kv_cache_memory_bytes=pool)
    cache = engine.resolved.cache
    assert cache.mamba_cache_mode == "align" and cache.block_size == 16
    cached: list[int] = []
    assert _run(engine, prompts, cached) == ref
    assert cached == [0, 0, 0, 0]
    # again: each prompt's state was saved at its last full block boundary
    assert _run(engine, prompts, cached) == ref
    assert cached == [16, 0, 16, 0]
    # a shared prefix (prompt 2's first block and 4 more tokens) followed by other tokens
    other = prompts[2][:20] + prompts[0][:5]
    want = _run(_engine(path, enable_prefix_caching=False), [other])
    assert _run(engine, [other], cached) == want and cached == [16]
    # chunked prefill (8-token chunks): states kept at every block boundary
    chunked = _engine(path, enable_prefix_caching=True, max_num_batched_tokens=8,
                      kv_cache_memory_bytes=pool)
    assert _run(chunked, prompts[2:3]) == ref[2:3]
    assert _run(chunked, prompts[2:3], cached) == ref[2:3] and cached == [16]


def test_cache_mode_dtypes_and_block_size_resolved(model_dir):
    """vLLM's MambaModelConfig: prefix caching off -> mamba_cache_mode "none" (even if
    "align" was asked), no saved states; mamba_ssm_cache_dtype / mamba_cache_dtype pick the
    state dtypes; the raised block size reaches the front end (EngineCoreReady)."""
    path, prompts, ref = model_dir
    engine = _engine(path, mamba_cache_mode="align", mamba_ssm_cache_dtype="bfloat16")
    cache = engine.engine_core.ready.config.cache
    assert cache.mamba_cache_mode == "none" and engine.scheduler.mamba_align is None
    assert engine.config.block_size == 8 and cache.block_size == 16  # asked 8, raised
    layer = engine.model_runner.mamba.layers[0]
    assert (layer.conv_state.dtype, layer.ssm_state.dtype) == (torch.float32, torch.bfloat16)
    assert len(_run(engine, prompts[:1])[0]) == MAX_TOKENS
    engine = _engine(path, mamba_cache_dtype="bfloat16")
    layer = engine.model_runner.mamba.layers[0]
    assert (layer.conv_state.dtype, layer.ssm_state.dtype) == (torch.bfloat16, torch.bfloat16)


def test_prefix_cache_hit_without_state_is_an_error(model_dir):
    path, prompts, _ = model_dir
    engine = _engine(path, enable_prefix_caching=True)
    engine.scheduler.mamba_align = None  # prefix caching without saved states
    _run(engine, [prompts[2]])
    with pytest.raises(InvalidArgumentError, match="mamba_cache_mode align"):
        _run(engine, [prompts[2]])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("prefill_backend", ["recurrent", "triton"])
def test_cuda_eager_and_decode_graphs(model_dir, prefill_backend, monkeypatch):
    """On CUDA (Triton conv + fused recurrent kernels, or the chunked kernels for prefill
    rows): fp32 matches transformers; decode CUDA graphs (persistent state indices, padding
    rows on the null slot) give the eager tokens, in fp32 and bf16, with prefix caching
    (align mode) on."""
    import libvllm.engine.layers.gdn as gdn

    monkeypatch.setattr(gdn, "GDN_PREFILL_BACKEND", prefill_backend)
    path, prompts, ref = model_dir
    for dtype in ("float32", "bfloat16"):
        got = []
        for eager in (True, False):
            engine = _engine(path, device="cuda", dtype=dtype, enforce_eager=eager,
                             enable_prefix_caching=True,
                             kv_cache_memory_bytes=64 << 20)  # engines live side by side
            assert (engine.model_runner.cudagraphs is None) == eager
            got.append(_run(engine, prompts))
            assert _run(engine, prompts) == got[-1]  # cache hits, same tokens
        assert got[0] == got[1]
        if dtype == "float32":
            assert got[0] == ref


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_small_pool_preempts_under_async_scheduling(model_dir):
    """On CUDA with async scheduling and CUDA graphs: a pool of 10 blocks preempts, state
    blocks are handed to new requests while the step before is still queued, and the
    fp32 greedy tokens stay transformers'; every block comes back."""
    path, prompts, ref = model_dir
    engine = _engine(path, device="cuda", dtype="float32", kv_cache_memory_bytes=10 * 2 * 4096,
                     async_scheduling=True, max_num_batched_tokens=8)
    assert _run(engine, prompts) == ref
    assert engine.scheduler.num_preemptions > 0
    _assert_slots_back(engine, prompts[1])


def test_triton_path_through_the_engine(kernel_model_dir, monkeypatch):
    """The GDN layers' Triton kernels (under TRITON_INTERPRET on CPU) through the engine:
    batched, chunked (8-token chunks, mixed prefill + decode steps), prefix-cached. One
    family: both build the same GatedDeltaNetAttention with the same head layout (COMMON),
    so the kernels see the same calls; the family-specific parts (weight loading, MoE) are
    checked on the torch path above (~45 s a family under the interpreter at 8 layers)."""
    import libvllm.engine.layers.gdn as gdn
    from libvllm.kernels.gated_delta_rule import _fused_recurrent_kernel

    if type(_fused_recurrent_kernel.fn).__name__ != "InterpretedFunction":
        pytest.skip("kernels/ compiled for a device (the GPU test covers this path)")
    monkeypatch.setattr(gdn, "use_kernels", lambda x: True)
    path, prompts, ref = kernel_model_dir
    want = ref[:3]
    engine = _engine(path, enable_prefix_caching=True, max_num_batched_tokens=16)
    assert _run(engine, prompts[:3], max_tokens=KERNEL_TOKENS) == want
    cached: list[int] = []
    assert _run(engine, prompts[:3], cached, KERNEL_TOKENS) == want and cached[2] == 16


def test_chunked_prefill_kernels_through_the_engine(kernel_model_dir, monkeypatch):
    """GDN_PREFILL_BACKEND "triton": prefill rows through kernels/chunk_gated_delta_rule.py,
    decode rows through the recurrent kernel in the same steps (8-token chunks beside
    decodes; the interpreter on CPU), the greedy tokens of transformers. One family, as
    above; the kernel tests cover both head layouts."""
    import libvllm.engine.layers.gdn as gdn
    from libvllm.kernels.chunk_gated_delta_rule import _chunk_wy_fwd_kernel

    if type(_chunk_wy_fwd_kernel.fn).__name__ != "InterpretedFunction":
        pytest.skip("kernels/ compiled for a device (the GPU test covers this path)")
    calls: list[int] = []
    mixed: list[int] = []  # recurrent calls beside the chunked one (-1: a prefill row)
    chunked, recurrent = gdn.chunk_sigmoid_gating_delta_rule, gdn.fused_sigmoid_gating_delta_rule
    monkeypatch.setattr(gdn, "chunk_sigmoid_gating_delta_rule",
                        lambda *a: calls.append(1) or chunked(*a))
    monkeypatch.setattr(gdn, "fused_sigmoid_gating_delta_rule",
                        lambda *a: mixed.append(-1 in a[9].tolist()) or recurrent(*a))
    monkeypatch.setattr(gdn, "use_kernels", lambda x: True)
    monkeypatch.setattr(gdn, "GDN_PREFILL_BACKEND", "triton")
    path, prompts, ref = kernel_model_dir
    engine = _engine(path, max_num_batched_tokens=16)
    assert _run(engine, prompts[:3], max_tokens=KERNEL_TOKENS) == ref[:3]
    assert calls and any(mixed)


def test_bad_prefill_backend_is_an_error(monkeypatch):
    import libvllm.engine.layers.gdn as gdn

    monkeypatch.setattr(gdn, "GDN_PREFILL_BACKEND", "flashinfer")
    with pytest.raises(InvalidArgumentError, match="LIBVLLM_GDN_PREFILL_BACKEND"):
        gdn.GatedDeltaNetAttention(32, 2, 4, 16, 16, 4, 1e-6)


def test_prefill_split_of_a_mixed_step():
    """GDNMetadata.prefill_split: rows of more than one token to the chunked kernels, one-token
    rows to the recurrent one (-1 in the other's indices), padding rows to neither."""
    from libvllm.engine.layers.gdn import GDNMetadata

    qsl = [0, 1, 71, 72, 75]
    md = GDNMetadata(qsl, [4, 2, 7, 3], [True, True, False, False], 70,
                     torch.tensor(qsl + [75], dtype=torch.int32),
                     torch.tensor([4, 2, 7, 3, 0]), torch.zeros(5, dtype=torch.bool))
    split = md.prefill_split
    assert split.prefill_state_indices_t.tolist() == [-1, 2, -1, 3, -1]
    assert split.decode_state_indices_t.tolist() == [4, -1, 7, -1, -1]
    assert split.chunk_indices_t.tolist() == [[1, 0], [1, 1], [3, 0]]
    assert md.prefill_split is split  # built once per step


@pytest.mark.parametrize("backend,lens,chunked", [
    ("auto", [1, 70, 1, 3], True),
    ("auto", [1024] + [2] * 20, True),  # one long prompt among many short rows
    ("auto", [1, 63, 1, 3], False),
    ("auto", [64, 1], True),
    ("auto", [1, 1], False),  # decode only: never chunked
    ("recurrent", [1024], False),
    ("triton", [1, 2], True),
])
def test_prefill_backend_choice(backend, lens, chunked, monkeypatch):
    """GDN_PREFILL_BACKEND "auto" takes the chunked kernels when the step's longest row has
    at least CHUNK_SIZE (64) tokens; "triton" always, for prefill steps; "recurrent" never."""
    import libvllm.engine.layers.gdn as gdn

    monkeypatch.setattr(gdn, "GDN_PREFILL_BACKEND", backend)
    qsl = [0]
    for n in lens:
        qsl.append(qsl[-1] + n)
    md = gdn.GDNMetadata(qsl, list(range(1, len(lens) + 1)), [False] * len(lens), max(lens),
                         torch.tensor(qsl, dtype=torch.int32), torch.arange(1, len(lens) + 1),
                         torch.zeros(len(lens), dtype=torch.bool))
    assert md.chunked_prefill is chunked
