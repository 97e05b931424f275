"""FP8 checkpoints (`quant_method: "fp8"`) and online FP8, and the FP8 layer methods.

Mirrors vllm/model_executor/layers/quantization/fp8.py (Fp8Config.from_config and its
errors, Fp8LinearMethod, Fp8MoEMethod: fp8 weights with `weight_scale_inv` per block or
`weight_scale` per tensor, `input_scale` with the static activation scheme) and
online/fp8.py (Fp8PerTensorOnlineLinearMethod / MoE method: `--quantization fp8` on an
unquantized checkpoint, which vLLM maps to fp8_per_tensor: one weight scale amax/448 per
layer (per expert in an MoE), activations dynamic per token).
The methods serve every WeightScheme (compressed-tensors' too). create_weights replaces a
layer's dense parameters with fp8 ones and scale parameters before the load;
process_weights_after_loading runs once loaded: on the CPU it dequantizes (exact fp32
math) into the dense parameter and removes the method, so the dense path runs the
dequantized FP8 weights (the accuracy tests compare against those); on CUDA the fp8
weights stay and `apply` runs the FP8 kernels (per-tensor shards requantized to their max
scale, as vLLM's requantize_with_max_scale).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from libvllm.engine.errors import ModelLoadError
from libvllm.engine.layers.fused_moe import fused_experts_triton
from libvllm.engine.layers.quantization import fp8_utils as fu
from libvllm.engine.layers.quantization.base_config import (
    QuantizationConfig,
    WeightScheme,
    get_from_keys,
    get_from_keys_or,
)
from libvllm.engine.layers.quantization.scale_loaders import (
    _splits,
    linear_widths,
    load_linear_scale,
    load_moe_scale,
)

ACTIVATION_SCHEMES = ["static", "dynamic"]


class Fp8Config(QuantizationConfig):
    name = "fp8"

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Fp8Config:
        activation_scheme = get_from_keys(config, ["activation_scheme"])
        if activation_scheme not in ACTIVATION_SCHEMES:
            raise ModelLoadError(f"Unsupported activation scheme {activation_scheme}")
        fmt = config.get("fmt", "e4m3")
        if fmt != "e4m3":
            raise ModelLoadError(f"quantization_config fmt {fmt!r} is not supported: FP8 "
                                 "weights must be e4m3 (float8_e4m3fn)")
        ignored = get_from_keys_or(config, ["ignored_layers"], None) or \
            get_from_keys_or(config, ["modules_to_not_convert"], None) or []
        if not isinstance(ignored, list):
            raise ModelLoadError("quantization_config: ignored_layers must be a list")
        block = get_from_keys_or(config, ["weight_block_size"], None)
        if block is None:
            return cls(WeightScheme("tensor", static_input=activation_scheme == "static"),
                       ignored)
        if not isinstance(block, list) or len(block) != 2:
            n = len(block) if isinstance(block, list) else block
            raise ModelLoadError("The quantization block size of weight must have 2 "
                                 f"dimensions, but got {n} dimensions")
        if not all(isinstance(b, int) and not isinstance(b, bool) and 0 < b <= 1 << 16
                   for b in block):
            raise ModelLoadError(f"weight_block_size must be two positive ints, got {block}")
        if activation_scheme != "dynamic":
            raise ModelLoadError("The block-wise quantization only supports dynamic "
                                 "activation scheme for now, but got "
                                 f"{activation_scheme} activation scheme.")
        return cls(WeightScheme("block", tuple(block)), ignored)


class Fp8OnlineConfig(QuantizationConfig):
    """`quantization="fp8"` without a checkpoint config: vLLM's fp8_per_tensor."""

    name = "fp8"

    def __init__(self) -> None:
        super().__init__(WeightScheme("tensor", serialized=False), [])


def _param(data: torch.Tensor, loader=None) -> nn.Parameter:
    p = nn.Parameter(data, requires_grad=False)
    p.keep_dtype = True  # fp8 weights and fp32 scales keep their dtype through .to()
    if loader is not None:
        p.weight_loader = loader
    return p


def _zeros(shape, device: torch.device) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.float32, device=device)  # scales are fp32


def _set(layer: nn.Module, name: str, data: torch.Tensor | None) -> None:
    """Replace (or with None, remove) parameter `name`."""
    layer._parameters.pop(name, None)
    if data is not None:
        layer.register_parameter(name, _param(data))


class Fp8LinearMethod:
    def __init__(self, scheme: WeightScheme) -> None:
        self.scheme = scheme

    def create_weights(self, layer: nn.Module, prefix: str,
                       device: torch.device | None = None) -> None:
        s, widths = self.scheme, linear_widths(layer)
        n, k = layer.output_size, layer.input_size  # this rank's
        tp, _, row = _splits(layer)
        if s.kind == "block":
            fu.validate_fp8_block_shape(prefix, widths, k, tp, row, s.block)
        if not s.serialized:
            return  # online: the dense weight loads, process_weights_after_loading quantizes
        dev = device or layer.weight.device
        layer.weight = _param(torch.empty(n, k, dtype=torch.float8_e4m3fn, device=dev),
                              layer.weight_loader)  # [N, K]
        shape = {"block": lambda: (fu.cdiv(n, s.block[0]), fu.cdiv(k, s.block[1])),
                 "channel": lambda: (n,), "tensor": lambda: (len(widths),)}[s.kind]()
        setattr(layer, s.scale_name, _param(
            _zeros(shape, dev), functools.partial(load_linear_scale, layer, s,
                                                              False)))
        if s.static_input:
            layer.input_scale = _param(_zeros(len(widths), dev),
                                       functools.partial(load_linear_scale, layer, s, True))

    def dequantize(self, layer: nn.Module) -> torch.Tensor:
        """fp32 [N, K] of the loaded fp8 weight."""
        s, w = self.scheme, layer.weight
        scale = getattr(layer, s.scale_name)
        if s.kind == "block":
            return fu.dequant_block(w, scale, s.block)
        if s.kind == "tensor" and scale.numel() != w.shape[0]:
            scale = fu.shard_row_scales(scale, linear_widths(layer))
        return fu.dequant_rows(w, scale)

    def process_weights_after_loading(self, layer: nn.Module, device: torch.device) -> None:
        s = self.scheme
        if not s.serialized:  # online per-tensor
            q, scale = fu.quantize_per_tensor(layer.weight.data)
            _set(layer, "weight", q)
            _set(layer, "weight_scale", scale)
            widths = [q.shape[0]]
        else:
            widths = linear_widths(layer)
        if device.type != "cuda":  # dense fp32 of the FP8 weight; the dense path runs it
            dense = fu.dequant_rows(layer.weight, layer.weight_scale.expand(
                layer.weight.shape[0])) if not s.serialized else self.dequantize(layer)
            for name in ("weight_scale_inv", "weight_scale", "input_scale"):
                _set(layer, name, None)
            layer.weight = nn.Parameter(dense, requires_grad=False)
            layer.weight.weight_loader = layer.weight_loader
            layer.quant_method = None
            return
        if s.kind == "tensor" and len(widths) > 1:
            q, scale = fu.requantize_with_max_scale(layer.weight, layer.weight_scale, widths)
            _set(layer, "weight", q)
            _set(layer, "weight_scale", scale)
        if s.static_input:
            _set(layer, "input_scale", layer.input_scale.max().reshape(1))

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None
              ) -> torch.Tensor:
        # x: [M, K] -> [M, N] (CUDA: fp8 weights)
        return fu.apply_fp8_linear(self.scheme, x, layer.weight,
                                   getattr(layer, self.scheme.scale_name),
                                   getattr(layer, "input_scale", None), bias)


class Fp8MoEMethod:
    """The experts' w13 [E, 2I, H] / w2 [E, H, I] in fp8 with their scales (vLLM's names:
    w13_weight_scale_inv, w2_weight_scale_inv; w13_weight_scale, w2_weight_scale;
    w13_input_scale, w2_input_scale)."""

    def __init__(self, scheme: WeightScheme) -> None:
        self.scheme = scheme

    def create_weights(self, layer: nn.Module, prefix: str,
                       device: torch.device | None = None) -> None:
        s = self.scheme
        e, i = layer.num_experts, layer.intermediate_size
        h = layer.w2_weight.shape[1]
        if s.kind == "block":
            fu.validate_fp8_block_shape_moe(prefix, i, layer.tp_size, s.block)
        if not s.serialized:
            return
        dev = device or layer.w13_weight.device
        for name, shape in (("w13_weight", (e, 2 * i, h)), ("w2_weight", (e, h, i))):
            setattr(layer, name, _param(torch.empty(shape, dtype=torch.float8_e4m3fn,
                                                    device=dev), layer.weight_loader))
        if s.kind == "block":
            bn, bk = s.block
            shapes = ((e, 2 * (i // bn), fu.cdiv(h, bk)), (e, fu.cdiv(h, bn), fu.cdiv(i, bk)))
        else:
            shapes = ((e, 2 * i), (e, h)) if s.kind == "channel" else ((e, 2), (e,))
        load = functools.partial(load_moe_scale, layer, s, False)
        for w, shape in zip(("w13", "w2"), shapes):
            setattr(layer, f"{w}_{s.scale_name}", _param(_zeros(shape, dev), load))
        if s.static_input:
            load = functools.partial(load_moe_scale, layer, s, True)
            layer.w13_input_scale = _param(_zeros((e, 2), dev), load)
            layer.w2_input_scale = _param(_zeros(e, dev), load)

    def _dequantize(self, w: torch.Tensor, scale: torch.Tensor, w13: bool) -> torch.Tensor:
        s = self.scheme
        if s.kind == "block":
            return fu.dequant_block(w, scale, s.block)
        if s.kind == "tensor":
            half = w.shape[1] // 2
            scale = scale.repeat_interleave(half, -1) if w13 else scale[:, None].expand(
                -1, w.shape[1])
        return fu.dequant_rows(w, scale)

    def process_weights_after_loading(self, layer: nn.Module, device: torch.device) -> None:
        s, names = self.scheme, ("w13", "w2")
        if not s.serialized:  # online: one scale per expert
            for w in names:
                qs = [fu.quantize_per_tensor(x) for x in getattr(layer, f"{w}_weight").data]
                _set(layer, f"{w}_weight", torch.stack([q for q, _ in qs]))
                _set(layer, f"{w}_weight_scale", torch.cat([sc for _, sc in qs]))
        if device.type != "cuda":
            for w in names:
                weight = getattr(layer, f"{w}_weight")
                scale = getattr(layer, f"{w}_{s.scale_name}")
                dense = fu.dequant_rows(weight, scale[:, None].expand(-1, weight.shape[1])) \
                    if not s.serialized else self._dequantize(weight, scale, w == "w13")
                for suffix in ("weight_scale_inv", "weight_scale", "input_scale"):
                    _set(layer, f"{w}_{suffix}", None)
                setattr(layer, f"{w}_weight", nn.Parameter(dense, requires_grad=False))
                getattr(layer, f"{w}_weight").weight_loader = layer.weight_loader
            layer.quant_method = None
            return
        if s.kind == "tensor" and s.serialized:  # gate and up under their max scale
            qs = [fu.requantize_with_max_scale(w, sc, [w.shape[0] // 2] * 2)
                  for w, sc in zip(layer.w13_weight.data, layer.w13_weight_scale.data)]
            _set(layer, "w13_weight", torch.stack([q for q, _ in qs]))
            _set(layer, "w13_weight_scale", torch.cat([sc for _, sc in qs]))
        if s.static_input:
            _set(layer, "w13_input_scale", layer.w13_input_scale.max().reshape(1))
            _set(layer, "w2_input_scale", layer.w2_input_scale.max().reshape(1))

    def apply(self, layer: nn.Module, x: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor) -> torch.Tensor:
        """CUDA: engine/layers/fused_moe/triton_experts.py fused_experts_triton with vLLM's
        fp8 keywords (scales [E, cdiv(2I, bn), cdiv(H, bk)] block, [E, N, 1] per channel,
        [E] per tensor; a1 / a2 static [1] or None: dynamic). Block scales at decode-sized
        batches take its FP8 GEMV pair (kernels/fused_moe_gemv_fp8.py)."""
        # x: [M, H], topk_*: [M, top_k] -> [M, H]
        s = self.scheme
        w1_scale = getattr(layer, f"w13_{s.scale_name}")
        w2_scale = getattr(layer, f"w2_{s.scale_name}")
        if s.kind == "channel":
            w1_scale, w2_scale = w1_scale.unsqueeze(-1), w2_scale.unsqueeze(-1)
        return fused_experts_triton(
            x, layer.w13_weight, layer.w2_weight, topk_weights, topk_ids, layer.act,
            use_fp8_w8a8=True, w1_scale=w1_scale, w2_scale=w2_scale,
            a1_scale=getattr(layer, "w13_input_scale", None),
            a2_scale=getattr(layer, "w2_input_scale", None),
            block_shape=list(s.block) if s.block else None)
