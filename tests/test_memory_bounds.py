"""Memory bounds of the engine core that a soak relies on: xgrammar's compiled-grammar
cache stays within VLLM_XGRAMMAR_CACHE_MB per compiler (vllm/v1/structured_output/
backend_xgrammar.py), while each request keeps its own matcher; the engine-core child
starts with glibc's malloc arenas capped (engine/engine_core/engine_core_utils.py), a set
MALLOC_ARENA_MAX winning. RSS itself is measured, not asserted, by
`python examples/bench/soak.py MODEL.gguf --mix stream,complete,structured`.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from engine.config import EngineConfig
from engine.engine_core import engine_core_utils
from engine.gguf.reader import GGUFReader
from engine.structured_output import (
    StructuredOutputManager,
    StructuredOutputRequest,
    StructuredOutputsConfig,
    StructuredOutputsParams,
)
from engine.tokenizer import Tokenizer

CACHE_MB = 4  # a JSON-schema grammar on the default model's 49k vocab takes ~2.5 MB


@pytest.fixture(scope="module")
def tokenizer(model_path):
    reader = GGUFReader(model_path)
    try:
        return Tokenizer.from_gguf_metadata(reader.metadata)
    finally:
        reader.close()


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
