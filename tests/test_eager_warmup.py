"""engine/worker/warmup.py: the start-up pass over eager steps (two small prefills, then a
decode row beside a long prefill, then the requests end) leaves the runner as it found it.

Oracle: the engine's own greedy tokens before the warm-up (themselves equal to
transformers in tests/test_hybrid_gdn_engine.py) and the runner's free rows and GDN state
slots. On CPU the steps run for real (the torch paths); on CUDA the engine start-up of a
hybrid model runs it with Triton launches only compiling.
"""

from __future__ import annotations

import pytest
import torch
from test_hybrid_gdn_engine import _run, _saved_model

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.worker.warmup import needs_eager_warm_up, warm_up_eager_steps

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    return _saved_model("qwen3_5", tmp_path_factory)


def _engine(path: str, device: str = "cpu") -> LLMEngine:
    return LLMEngine.from_config(EngineConfig(
        model=path, device=device, max_model_len=256, enable_prefix_caching=False,
        skip_tokenizer_init=True, block_size=8, max_num_seqs=4, multiprocessing=False))


def test_the_warm_up_leaves_the_runner_as_it_found_it(hybrid):
    """As at start-up: a fresh engine, warmed up, then its greedy tokens."""
    path, prompts, ref = hybrid
    engine = _engine(path)
    runner = engine.model_runner
    assert not needs_eager_warm_up(runner)  # CPU: no Triton variants to compile
    before = (sorted(runner.mamba.free_slots), sorted(runner.block_table._free))
    assert warm_up_eager_steps(runner, engine._inproc_core().num_gpu_blocks) > 0
    assert not runner.requests and not runner.mamba.slot_of
    assert (sorted(runner.mamba.free_slots), sorted(runner.block_table._free)) == before
    assert _run(engine, prompts) == ref


def test_no_room_no_warm_up(hybrid):
    path, _, _ = hybrid
    engine = LLMEngine.from_config(EngineConfig(
        model=path, device="cpu", max_model_len=64, enable_prefix_caching=False,
        skip_tokenizer_init=True, block_size=8, max_num_seqs=4, multiprocessing=False))
    assert warm_up_eager_steps(engine.model_runner, engine._inproc_core().num_gpu_blocks) == 0.0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_start_up_warms_up_a_hybrid_model(hybrid, caplog):
    path, prompts, ref = hybrid
    with caplog.at_level("INFO", logger="engine.worker.warmup"):
        engine = _engine(path, device="cuda")
    assert needs_eager_warm_up(engine.model_runner)  # decode-only graphs
    assert any("eager steps warmed up" in r.message for r in caplog.records)
    got = _run(engine, prompts)
    assert sum(a == b for x, y in zip(got, ref, strict=True) for a, b in zip(x, y)) >= \
        0.9 * sum(map(len, ref))  # bf16 / fp32 kernels: tokens as the CUDA engine test
