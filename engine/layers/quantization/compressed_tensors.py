"""compressed-tensors FP8 checkpoints (llm-compressor's FP8_DYNAMIC and static FP8).

Mirrors vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py
(CompressedTensorsConfig.from_config: config_groups, ignore, _is_fp8_w8a8 and its
"No compressed-tensors compatible scheme was found" error) and
schemes/compressed_tensors_w8a8_fp8.py (CompressedTensorsW8A8Fp8: fp8 weights with
`weight_scale` per channel [N, 1], per tensor [1] or per block, activations dynamic per
token / group or static per tensor with `input_scale`) and compressed_tensors_moe
(CompressedTensorsW8A8Fp8MoEMethod, the same scales per expert). One config group
targeting the Linear layers is supported; the layer methods are fp8.py's.
"""

from __future__ import annotations

from typing import Any

from libvllm.engine.errors import ModelLoadError
from libvllm.engine.layers.quantization.base_config import QuantizationConfig, WeightScheme

_FORMATS = ("float-quantized", "naive-quantized")


def _scheme_error(name: str, weights: Any, inputs: Any, fmt: Any) -> ModelLoadError:
    return ModelLoadError(f"No compressed-tensors compatible scheme was found for "
                          f"layer_name={name!r}, weight_quant={weights!r}, "
                          f"input_quant={inputs!r}, format={fmt!r}: supported are FP8 "
                          "W8A8 (num_bits 8, type float, symmetric static weights by "
                          "tensor, channel or block; dynamic or static-tensor activations)")


def _fp8_scheme(group: str, weights: Any, inputs: Any, fmt: Any) -> WeightScheme:
    """vLLM's _is_fp8_w8a8 as a WeightScheme, or the unsupported-scheme error."""
    if not isinstance(weights, dict) or not isinstance(inputs, dict):
        raise _scheme_error(group, weights, inputs, fmt)
    for q in (weights, inputs):
        if q.get("num_bits") != 8 or q.get("type") != "float":
            raise _scheme_error(group, weights, inputs, fmt)
    strategy = weights.get("strategy")
    if not weights.get("symmetric", True) or weights.get("dynamic", False) or \
            strategy not in ("tensor", "channel", "block"):
        raise _scheme_error(group, weights, inputs, fmt)
    block = None
    if strategy == "block":
        block = weights.get("block_structure")
        if not isinstance(block, list) or len(block) != 2 or not all(
                isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block):
            raise ModelLoadError(f"compressed-tensors group {group!r}: block_structure "
                                 f"must be two positive ints, got {block!r}")
        block = tuple(block)
    if inputs.get("dynamic"):
        if inputs.get("strategy") not in ("token", "tensor", "group"):
            raise _scheme_error(group, weights, inputs, fmt)
        return WeightScheme(strategy, block, block_scale_name="weight_scale")
    if not inputs.get("symmetric", True) or inputs.get("strategy") != "tensor" or \
            strategy == "block":
        raise _scheme_error(group, weights, inputs, fmt)
    return WeightScheme(strategy, block, static_input=True)


class CompressedTensorsConfig(QuantizationConfig):
    name = "compressed-tensors"

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> CompressedTensorsConfig:
        fmt = config.get("format", "float-quantized")
        groups = config.get("config_groups")
        if not isinstance(groups, dict) or not groups:
            raise ModelLoadError("compressed-tensors quantization_config needs config_groups")
        if len(groups) != 1:
            raise ModelLoadError("compressed-tensors: only one config group is supported, "
                                 f"got {sorted(groups)}")
        (name, group), = groups.items()
        if not isinstance(group, dict):
            raise ModelLoadError(f"compressed-tensors group {name!r} must be an object")
        targets = group.get("targets", ["Linear"])
        if targets != ["Linear"]:
            raise ModelLoadError(f"compressed-tensors group {name!r}: targets {targets!r} "
                                 "are not supported (only ['Linear'])")
        if group.get("output_activations") is not None or fmt not in _FORMATS:
            raise _scheme_error(name, group.get("weights"), group.get("input_activations"),
                                fmt)
        scheme = _fp8_scheme(name, group.get("weights"), group.get("input_activations"), fmt)
        ignore = config.get("ignore") or []
        if not isinstance(ignore, list):
            raise ModelLoadError("compressed-tensors: ignore must be a list")
        return cls(scheme, ignore)
