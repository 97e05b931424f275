"""Memory bounds of the engine core that a soak relies on: xgrammar's compiled-grammar
cache stays within VLLM_XGRAMMAR_CACHE_MB per compiler (vllm/v1/structured_output/
backend_xgrammar.py), while each request keeps its own matcher; the engine-core child
starts with glibc's malloc arenas capped (engine/engine_core/engine_core_utils.py), a set
MALLOC_ARENA_MAX winning; the KV cache is zeroed at start-up as vLLM's
(vllm/v1/worker/utils.py allocates it with torch.zeros), so its pages are resident from
the start instead of each request's new blocks growing the RSS until the pool was
touched. RSS itself is measured, not asserted, by
`python examples/bench/soak.py MODEL.gguf --mix stream,complete,structured`.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess

import pytest

from libvllm.engine.config import EngineConfig
from libvllm.engine.engine_core import engine_core_utils
from libvllm.engine.llm_engine import LLMEngine
from libvllm.engine.structured_output import (
    StructuredOutputManager,
    StructuredOutputRequest,
    StructuredOutputsConfig,
    StructuredOutputsParams,
)

CACHE_MB = 4  # a JSON-schema grammar on the default model's 49k vocab takes ~2.5 MB


@pytest.fixture(scope="module")
def tokenizer(gguf_tokenizer):
    return gguf_tokenizer


def _schema(n: int) -> str:
    return json.dumps({"type": "object", "properties": {
        "k": {"type": "string", "maxLength": n}}, "required": ["k"]})


def test_xgrammar_cache_stays_within_its_megabytes(tokenizer):
    config = StructuredOutputsConfig(xgrammar_cache_mb=CACHE_MB)
    manager = StructuredOutputManager(tokenizer, tokenizer.vocab_size, config)
    try:
        sizes = []
        for n in range(2, 10):  # eight distinct grammars: more than CACHE_MB compiled
            params = manager.validate(StructuredOutputsParams(json=_schema(n)))
            req = StructuredOutputRequest(params, request_id=f"r{n}", stop_token_ids={2})
            manager.grammar_init(req)
            req.wait_grammar()
            assert req.grammar is not None
            sizes.append(manager.backends["xgrammar"].compiler.get_cache_size_bytes())
        assert 0 < max(sizes) <= CACHE_MB << 20, sizes
        assert sizes[-1] > 0  # evicts the oldest, still caches the newest
    finally:
        manager.clear_backend()


class _Launched(Exception):
    pass


@pytest.mark.parametrize("preset", [None, "8"])
def test_core_child_starts_with_capped_malloc_arenas(monkeypatch, tmp_path, preset):
    if preset is None:
        monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    else:
        monkeypatch.setenv("MALLOC_ARENA_MAX", preset)
    seen = {}

    def popen(argv, env, **kwargs):
        seen.update(env)
        raise _Launched

    monkeypatch.setattr(subprocess, "Popen", popen)
    with pytest.raises(_Launched):
        engine_core_utils.launch_core_process(
            EngineConfig(model="m.gguf"), str(tmp_path), "ipc://in", "ipc://out")
    assert seen["MALLOC_ARENA_MAX"] == (preset or engine_core_utils.CORE_MALLOC_ARENA_MAX)


def _resident_fraction(tensor) -> float:
    """The fraction of the pages under `tensor` that are in RAM (/proc/self/pagemap bit 63)."""
    page = resource.getpagesize()
    first = tensor.data_ptr() // page
    last = (tensor.data_ptr() + tensor.numel() * tensor.element_size() - 1) // page
    with open(f"/proc/{os.getpid()}/pagemap", "rb") as pagemap:
        pagemap.seek(first * 8)
        entries = pagemap.read((last - first + 1) * 8)
    present = sum(entries[i + 7] >> 7 for i in range(0, len(entries), 8))
    return present / (last - first + 1)


def test_kv_cache_is_resident_from_the_start(model_path):
    engine = LLMEngine.from_config(EngineConfig(
        model=model_path, max_model_len=128, max_num_seqs=2, kv_cache_memory_bytes=32 << 20))
    try:
        runner = engine.engine_core.engine_core.model_runner
        caches = [m.kv_cache for m in runner.model.modules() if hasattr(m, "kv_cache")]
        assert caches and sum(c.numel() * c.element_size() for c in caches) >= 16 << 20
        assert min(_resident_fraction(c) for c in caches) == 1.0
    finally:
        engine.shutdown()
