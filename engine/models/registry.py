"""ModelRegistry: HF architecture name -> model class, as
vllm/model_executor/models/registry.py (_TEXT_GENERATION_MODELS, resolve_model_cls).

Model files are imported lazily, only when their architecture is asked for. Mistral is
served by the Llama file, as in vLLM. GGUF files name their architecture differently
(general.architecture); GGUF_ARCHITECTURES maps those names to the HF ones.
"""

from __future__ import annotations

import importlib

from torch import nn

from libvllm.engine.errors import UnsupportedError

# HF architecture -> (module under engine.models, class name)
_TEXT_GENERATION_MODELS = {
    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("qwen2", "Qwen2ForCausalLM"),
    "Qwen3ForCausalLM": ("qwen3", "Qwen3ForCausalLM"),
    "Gemma3ForCausalLM": ("gemma3", "Gemma3ForCausalLM"),
    "Qwen3MoeForCausalLM": ("qwen3_moe", "Qwen3MoeForCausalLM"),
    "MixtralForCausalLM": ("mixtral", "MixtralForCausalLM"),
    "Qwen3NextForCausalLM": ("qwen3_next", "Qwen3NextForCausalLM"),
    "Qwen3_5ForCausalLM": ("qwen3_5", "Qwen3_5ForCausalLM"),
    "Qwen3_5ForConditionalGeneration": ("qwen3_5", "Qwen3_5ForConditionalGeneration"),
    "Qwen3_5MoeForCausalLM": ("qwen3_5_moe", "Qwen3_5MoeForCausalLM"),
    "Qwen3_5MoeForConditionalGeneration": ("qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration"),
}

# GGUF general.architecture -> HF architecture
GGUF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
    # hybrid Gated DeltaNet (engine/model_loader/gguf_hybrid.py reads their metadata)
    "qwen3next": "Qwen3NextForCausalLM",
    "qwen35": "Qwen3_5ForCausalLM",
    "qwen35moe": "Qwen3_5MoeForCausalLM",
}


def get_supported_archs() -> list[str]:
    return list(_TEXT_GENERATION_MODELS)


def resolve_model_cls(architectures: list[str]) -> tuple[type[nn.Module], str]:
    """The class of the first supported architecture in `architectures`, and its name."""
    if not architectures:
        raise UnsupportedError("No model architectures are specified")
    for arch in architectures:
        if arch in _TEXT_GENERATION_MODELS:
            module, cls = _TEXT_GENERATION_MODELS[arch]
            return getattr(importlib.import_module(f"libvllm.engine.models.{module}"), cls), arch
    raise UnsupportedError(f"Model architectures {list(architectures)} are not supported for "
                           f"now. Supported architectures: {get_supported_archs()}")
