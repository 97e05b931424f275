"""Where a model's files are and the tokenizer they hold, without importing torch.

A path is a .gguf file (or a directory holding exactly one), else a Hugging Face directory
with config.json (vllm/model_executor/model_loader/__init__.py picks its loader the same
way). The engine core loads its tokenizer from the source its weights came from; a front
end whose core runs in a child process loads it alone from here, reading no weight
(vllm/v1/engine/llm_engine.py builds its tokenizer, the core its model), and so never
imports torch (.agents/specs/torch-free-front-end.md). A GGUF's tokenizer comes from its
key/values: the open reader's, or those the engine core read and sent in its ready
message (EngineCoreReady.gguf_metadata), so the front end never re-opens the file.
"""

from __future__ import annotations

import os

from libvllm.engine.config import EngineConfig
from libvllm.engine.errors import ModelLoadError
from libvllm.engine.gguf.reader import GGUFReader
from libvllm.engine.tokenizer import Tokenizer


def resolve_model_path(path: str) -> tuple[str, str]:
    """("gguf", file) or ("hf", directory) for `path`."""
    if not os.path.exists(path):
        raise ModelLoadError(f"model path does not exist: {path}")
    if os.path.isfile(path):
        return "gguf", path
    ggufs = sorted(f for f in os.listdir(path) if f.endswith(".gguf"))
    if len(ggufs) == 1:
        return "gguf", os.path.join(path, ggufs[0])
    if len(ggufs) > 1:
        raise ModelLoadError(f"{path}: several .gguf files, pass one of them: {ggufs}")
    if os.path.isfile(os.path.join(path, "config.json")):
        return "hf", path
    raise ModelLoadError(f"{path}: no model found (expected a .gguf file or config.json)")


def load_tokenizer(config: EngineConfig, source: GGUFReader | dict | str | None = None
                   ) -> Tokenizer | None:
    """The engine's tokenizer (None with skip_tokenizer_init). source: the open GGUF
    reader, a GGUF's key/values or the HF directory the model came from; None: found
    from config.model."""
    if config.skip_tokenizer_init:  # vLLM: token-id prompts, token-id outputs
        return None
    if config.tokenizer is not None:  # vLLM --tokenizer
        return Tokenizer.from_hf_dir(config.tokenizer)
    if source is None:
        if config.load_format == "dummy":
            return Tokenizer.from_hf_dir(config.model)
        kind, path = resolve_model_path(config.model)
        if kind == "hf":
            return Tokenizer.from_hf_dir(path)
        reader = GGUFReader(path)
        try:
            return Tokenizer.from_gguf_metadata(reader.metadata)
        finally:
            reader.close()
    if isinstance(source, str):  # a Hugging Face directory
        return Tokenizer.from_hf_dir(source)
    return Tokenizer.from_gguf_metadata(source if isinstance(source, dict) else source.metadata)
