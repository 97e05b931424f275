"""The CPU KV cache's default size: min(VLLM_CPU_KVCACHE_SPACE GiB (vLLM's legacy setting;
unset or 0: 4 GiB), what max_num_seqs full contexts need) (engine/engine_core/engine_core.py).
Ours: vLLM's CPU platform sets kv_cache_memory_bytes to the variable's GiB; here it caps a
default that otherwise takes no more than the batch can use."""

from __future__ import annotations

import pytest

from libvllm.engine.config import EngineConfig
from libvllm.engine.llm_engine import LLMEngine


def _blocks(model_path: str, max_model_len: int) -> tuple[int, int]:
    engine = LLMEngine.from_config(EngineConfig(model=model_path, device="cpu",
                                                max_model_len=max_model_len,
                                                multiprocessing=False))
    try:
        core = engine.engine_core.engine_core
        return core.num_gpu_blocks, engine.engine_core.ready.config.cache.block_size
    finally:
        engine.shutdown()


def test_space_caps_the_cpu_default(model_path, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    one, _ = _blocks(model_path, 2048)  # 256 full 2,048-token contexts need far more
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")
    two, _ = _blocks(model_path, 2048)
    assert two == 2 * one


def test_the_default_takes_no_more_than_the_batch_needs(model_path, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")
    blocks, block_size = _blocks(model_path, 64)  # 256 x 64 tokens: well under 2 GiB
    assert blocks * block_size < 256 * (64 + 2 * block_size)


@pytest.mark.parametrize("value", ["x", "1.5"])
def test_a_bad_value_is_a_clear_error(model_path, monkeypatch, value):
    from libvllm.engine.errors import InvalidArgumentError

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", value)
    with pytest.raises(InvalidArgumentError, match="VLLM_CPU_KVCACHE_SPACE"):
        _blocks(model_path, 64)
