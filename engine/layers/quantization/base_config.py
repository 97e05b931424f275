"""What a quantization config says about a checkpoint, and which layers it quantizes.

Mirrors vllm/model_executor/layers/quantization/base_config.py (QuantizationConfig:
get_name, from_config, get_from_keys, get_quant_method) and utils/quant_utils.py
(is_layer_skipped with the fused-module mapping). A config resolves to one WeightScheme
(the weight scale layout: 128x128-style blocks, per output channel or per tensor; whether
the checkpoint holds FP8 weights or the engine quantizes them at load; static or dynamic
activation scales) and a list of ignored modules. apply_quant_config gives every linear
layer and FusedMoE it quantizes a method object (quant_method, engine/layers/quantization/
fp8.py) before the weights load.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from libvllm.engine.errors import ModelLoadError

FP8_DTYPE_NAME = "float8_e4m3fn"
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max


@dataclass(frozen=True)
class WeightScheme:
    """kind: "block" (scale_inv [ceil(N/bn), ceil(K/bk)]), "channel" (scale [N]) or
    "tensor" (one scale per checkpoint shard); serialized: the checkpoint holds FP8
    weights (else bf16/fp32 weights are quantized at load, vLLM's online FP8);
    static_input: a per-tensor `input_scale` comes with each weight; block_scale_name: the
    checkpoint's name of a block scale (`weight_scale_inv` in fp8 checkpoints,
    `weight_scale` in compressed-tensors ones)."""

    kind: str
    block: tuple[int, int] | None = None
    serialized: bool = True
    static_input: bool = False
    block_scale_name: str = "weight_scale_inv"

    @property
    def scale_name(self) -> str:
        """The checkpoint's (and the layer's) name of the weight scale, after `<module>.`."""
        return self.block_scale_name if self.kind == "block" else "weight_scale"


class QuantizationConfig:
    """A checkpoint's (or the engine's online) quantization: scheme + ignored modules."""

    name = ""

    def __init__(self, scheme: WeightScheme, ignored: list[str]) -> None:
        self.scheme = scheme
        self.ignored = [normalize_module_name(n) for n in ignored]

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> QuantizationConfig:
        raise NotImplementedError

    def is_ignored(self, module: str) -> bool:
        """Whether checkpoint module `module` stays unquantized: an exact name, or a
        `re:` pattern (compressed-tensors' ignore list)."""
        for entry in self.ignored:
            if entry.startswith("re:"):
                if re.match(entry[3:], module):
                    return True
            elif entry == module:
                return True
        return False

    def is_layer_skipped(self, prefix: str, shards: list[str]) -> bool:
        """vLLM's is_layer_skipped: a fused layer is skipped when all its checkpoint
        shards are; some but not all is an error."""
        names = [f"{prefix.rpartition('.')[0]}.{s}".lstrip(".") for s in shards] \
            if shards else [prefix]
        skipped = [self.is_ignored(n) for n in names]
        if any(skipped) and not all(skipped):
            raise ModelLoadError(f"Detected some but not all shards of {prefix} are "
                                 "quantized. All shards of fused layers to have the same "
                                 "precision.")
        return all(skipped)


def normalize_module_name(name: str) -> str:
    """The text-model name of a VL checkpoint's module (as the models' load_weights)."""
    if not isinstance(name, str):
        raise ModelLoadError(f"quantization_config: ignored module {name!r} is not a string")
    return "model." + name[len("model.language_model."):] \
        if name.startswith("model.language_model.") else name


def get_from_keys(config: dict[str, Any], keys: list[str]) -> Any:
    """The first of `keys` in the config (vLLM's get_from_keys and its error)."""
    for key in keys:
        if key in config:
            return config[key]
    raise ModelLoadError(f"Cannot find any of {keys} in the model's quantization config.")


def get_from_keys_or(config: dict[str, Any], keys: list[str], default: Any) -> Any:
    try:
        return get_from_keys(config, keys)
    except ModelLoadError:
        return default
