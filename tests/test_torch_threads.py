"""Torch's intra-op threads while serving on CUDA (engine/worker/torch_threads.py), as
vLLM 0.33's vllm/utils/torch_utils.py set_torch_threads_for_runtime: 1 thread once the
model is loaded, unless OMP_NUM_THREADS (vLLM's rule) or vllm.h's n_threads chose a
count. No vLLM test covers it; the oracle is its documented rule.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from libvllm.engine.worker.torch_threads import set_torch_threads_for_runtime

MODELS = Path(__file__).resolve().parent.parent / "examples/bench/models"


@pytest.fixture
def two_threads(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_drops_to_one_thread_by_default(two_threads):
    set_torch_threads_for_runtime()
    assert torch.get_num_threads() == 1


def test_omp_num_threads_in_the_environment_is_kept(two_threads, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    set_torch_threads_for_runtime()
    assert torch.get_num_threads() == 2


def test_n_threads_is_kept(two_threads):
    set_torch_threads_for_runtime(n_threads=2)
    assert torch.get_num_threads() == 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_engine_core_serves_with_one_thread(two_threads, tmp_path):
    from libvllm.engine.config import EngineConfig
    from libvllm.engine.engine_core.engine_core import EngineCore

    config = json.loads((MODELS / "llama-3.1-8b/config.json").read_text())
    config.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  vocab_size=1024, max_position_embeddings=512)
    (tmp_path / "config.json").write_text(json.dumps(config))
    core, _ = EngineCore.from_config(EngineConfig(
        str(tmp_path), device="cuda", load_format="dummy", skip_tokenizer_init=True,
        enforce_eager=True, kv_cache_memory_bytes=1 << 24, multiprocessing=False))
    try:
        assert torch.get_num_threads() == 1
    finally:
        core.shutdown()
