"""vllm_model_info's n_params / n_layers and vllm_model_meta_* come from what the engine
loaded: the loader counts the checkpoint's tensor index (EngineCoreReady.n_params,
n_layers) and the core's ready message carries a GGUF's key/values, so neither the
session nor a child core's front end re-opens the model file.

Oracles: today's definitions, computed here from the file after the counting: the sum of
the GGUF's tensor n_elements and its <arch>.block_count (GGUFReader), the sum of the
safetensors header shapes and config.json's num_hidden_layers; -1 parameters on a dummy
load. Upstream has no model-metadata API (llama.h's llama_model_meta_* is the model);
the ready message mirrors vllm/v1/engine/core.py's handshake.
"""

from __future__ import annotations

import ast
import builtins
import json
import math
import os
import struct
from pathlib import Path

import pytest

from libvllm.engine.config import EngineConfig
from libvllm.engine.gguf.reader import GGUFReader
from libvllm.engine.session import EngineSession, model_meta
from tests.test_dummy_loader import dummy_engine, write_config


def test_session_model_meta_imports_no_model_file_reader():
    tree = ast.parse(Path(model_meta.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not imported & {"libvllm.engine.gguf.reader", "libvllm.engine.model_source", "struct",
                           "safetensors"}, imported


@pytest.fixture
def count_opens(monkeypatch):
    """Paths this process passes to open() (a GGUF is mapped through it: reader.py
    _map_file)."""
    opened: list[str] = []
    real_open = builtins.open

    def counting_open(file, *args, **kwargs):
        opened.append(str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    return opened


def _all_metadata(session: EngineSession) -> tuple:
    info = session.model_info()
    metadata = session.model_metadata()
    return info, {key: metadata[key] for key in list(metadata)}


@pytest.mark.parametrize("multiprocessing", [False, True], ids=["in-process", "child-core"])
def test_gguf_model_info_and_metadata_open_the_file_only_for_the_load(
        model_path, count_opens, multiprocessing):
    session = EngineSession.create(EngineConfig(model=model_path, max_model_len=128,
                                                multiprocessing=multiprocessing))
    try:
        at_load = count_opens.count(model_path)
        info, metadata = _all_metadata(session)
        assert session.model_metadata() is session.model_metadata()  # kept, not re-read
    finally:
        session.shutdown()
    # the loader's one open (in this process, or in the child whose front end opens none)
    assert at_load == (0 if multiprocessing else 1)
    assert count_opens.count(model_path) == at_load  # model info + metadata opened nothing
    with GGUFReader(model_path) as r:  # the oracle, after the counting
        assert list(metadata) == list(r.metadata) and metadata == r.metadata
        assert info.n_params == sum(t.n_elements for t in r.tensors.values())
        assert info.n_layers == r.metadata[f"{r.metadata['general.architecture']}.block_count"]
    assert info.quantization == "gguf:Q4_1"  # general.file_type from the carried metadata


def _safetensors_numel(path: str) -> int:
    """The sum of every header shape of the directory's safetensors files."""
    total = 0
    for name in sorted(f for f in os.listdir(path) if f.endswith(".safetensors")):
        with open(os.path.join(path, name), "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        total += sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")
    return total


def test_safetensors_counts_come_from_the_load(tmp_path, count_opens):
    from safetensors.torch import save_file

    path = write_config(tmp_path, "LlamaForCausalLM")
    engine = dummy_engine(path)
    state = {k: v.detach().clone().contiguous()
             for k, v in engine.model_runner.model.state_dict().items()}
    engine.shutdown()
    save_file(state, os.path.join(path, "model.safetensors"))
    session = EngineSession.create(EngineConfig(path, device="cpu", skip_tokenizer_init=True,
                                                multiprocessing=False, max_model_len=64))
    try:
        count_opens.clear()
        info, metadata = _all_metadata(session)
        session.model_metadata()
    finally:
        session.shutdown()
    assert [p for p in count_opens if p.endswith(".safetensors")] == []
    assert count_opens.count(os.path.join(path, "config.json")) == 1  # read once
    assert info.n_params == _safetensors_numel(path) == sum(t.numel() for t in state.values())
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    assert metadata == config and info.n_layers == config["num_hidden_layers"] == 2


def test_dummy_load_has_no_parameter_count(tmp_path):
    path = write_config(tmp_path, "Qwen3ForCausalLM")
    session = EngineSession.create(EngineConfig(path, device="cpu", load_format="dummy",
                                                skip_tokenizer_init=True,
                                                multiprocessing=False, max_model_len=64))
    try:
        info = session.model_info()
        ready = session.engine.engine_core.ready
    finally:
        session.shutdown()
    assert info.n_params == -1 and info.n_layers == 2
    assert ready.n_params == -1 and ready.gguf_metadata is None
