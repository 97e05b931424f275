"""capi.generation_defaults: vllm_sampling_params.use_generation_config (since ABI 1.3),
the model's generation_config.json defaults for C callers.

vLLM applies them in its OpenAI layer (--generation-config auto): a request field left
unset takes the model's default (ModelConfig.get_diff_sampling_param, engine/models/
config.py here; the engine core sends them in its ready message), else vLLM's
(vllm/entrypoints/openai/chat_completion/protocol.py to_sampling_params with
default_sampling_params; engine/entrypoints/openai/serving_engine.py here). A C struct has
no "unset": a field still holding its vllm_sampling_params_init value counts as unset.
The defaults are written into the shim's copy of the caller's struct, before it becomes
SamplingParams (capi.plumbing.sampling_params), so vLLM's checks see the final values.
"""

from __future__ import annotations

from _libvllm import ffi, lib

from libvllm.engine.session import InvalidArgumentError

# get_diff_sampling_param's names (max_new_tokens already renamed max_tokens) -> the C
# field's Python type
_FIELDS = {"temperature": float, "top_p": float, "top_k": int, "min_p": float,
           "repetition_penalty": float, "presence_penalty": float,
           "frequency_penalty": float, "max_tokens": int, "skip_special_tokens": int}


def _init_values():
    values = ffi.new("vllm_sampling_params *")
    lib.vllm_sampling_params_init(values, ffi.sizeof("vllm_sampling_params"))
    return values


_INIT = _init_values()


def apply_generation_config(p, model_defaults: dict) -> None:
    """With p.use_generation_config, each field of p at its init value takes the model's
    default (p: the shim's copy, a vllm_sampling_params *)."""
    if not p.use_generation_config:
        return
    for name, value in model_defaults.items():
        kind = _FIELDS.get(name)
        if kind is None or getattr(p, name) != getattr(_INIT, name):
            continue
        try:
            setattr(p, name, kind(value))
        except (TypeError, ValueError, OverflowError):
            raise InvalidArgumentError(
                f"use_generation_config: the model's generation_config.json {name} "
                f"{value!r} is not a valid {kind.__name__}") from None
