"""FP8 checkpoint tensors: each fp8 weight with its scales, checked at load.

Mirrors the scale handling of vllm/model_executor/model_loader/default_loader.py and the
weight loaders of vllm/model_executor/parameter.py: a float8_e4m3fn `<module>.weight`
comes with `<module>.weight_scale_inv` [ceil(N/bn), ceil(K/bk)] (block FP8) or
`<module>.weight_scale` ([N, 1] / [N] per channel, one value per tensor) and, with
static activations, `<module>.input_scale`. The scales are read next to their weight (by
name, from whichever file holds them) and attached to it (`fp8_scales`, `fp8_scheme`);
engine/models/utils.py load_weights loads them into the layer's scale parameters, or
dequantizes the weight for a layer that stays dense. Every malformed case is a
ModelLoadError naming the tensor: an fp8 weight without an FP8 quantization_config, a
missing or mis-shaped scale, a scale of a non-fp8 weight, a scale without its weight.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from libvllm.engine.errors import ModelLoadError
from libvllm.engine.layers.quantization import QuantizationConfig, WeightScheme
from libvllm.engine.layers.quantization.fp8_utils import cdiv
from libvllm.engine.model_loader.weight_utils import open_safetensors, safetensors_weights_iterator

SCALE_SUFFIXES = ("weight_scale_inv", "weight_scale", "input_scale")
_SCALE_DTYPES = {torch.float32, torch.bfloat16, torch.float16}


def _want_scale_shape(scheme: WeightScheme, name: str, w: torch.Tensor,
                      scale: torch.Tensor) -> None:
    n, k = w.shape
    if scheme.kind == "block":
        bn, bk = scheme.block
        ok = tuple(scale.shape) == (cdiv(n, bn), cdiv(k, bk))
        want = f"[{cdiv(n, bn)}, {cdiv(k, bk)}] (weight [{n}, {k}] in {bn}x{bk} blocks)"
    elif scheme.kind == "channel":
        ok = tuple(scale.shape) in ((n, 1), (n,))
        want = f"[{n}, 1] (one per output channel)"
    else:
        ok, want = scale.numel() == 1, "one value (per tensor)"
    if not ok:
        raise ModelLoadError(f"{name} has shape {list(scale.shape)}, want {want}")


def fp8_weights_iterator(files: list[str], qcfg: QuantizationConfig | None
                         ) -> Iterator[tuple[str, torch.Tensor]]:
    """safetensors_weights_iterator with the scales attached to their fp8 weights."""
    with contextlib.ExitStack() as stack:
        handles = [stack.enter_context(open_safetensors(f)) for f in files]
        index = {name: h for h in handles for name in h.keys()}

        def read(name: str) -> torch.Tensor:
            t = index[name].get_tensor(name)
            if t.dtype not in _SCALE_DTYPES:
                raise ModelLoadError(f"scale {name} has dtype {t.dtype}; want float32")
            return t.float()

        for name, w in safetensors_weights_iterator(files):
            base, _, suffix = name.rpartition(".")
            if suffix in SCALE_SUFFIXES:
                if f"{base}.weight" not in index:
                    raise ModelLoadError(f"scale {name} has no weight {base}.weight")
                continue  # read with its weight
            stored = [s for s in SCALE_SUFFIXES if f"{base}.{s}" in index] \
                if suffix == "weight" else []
            if w.dtype != torch.float8_e4m3fn:
                if stored:
                    raise ModelLoadError(f"{name} has dtype {w.dtype} but its scale "
                                         f"{base}.{stored[0]} is stored: a quantized weight "
                                         "must be float8_e4m3fn")
                yield name, w
                continue
            if qcfg is None or not qcfg.scheme.serialized:
                raise ModelLoadError(f"{name} is float8_e4m3fn but config.json has no FP8 "
                                     "quantization_config")
            scheme = qcfg.scheme
            if suffix != "weight" or w.dim() != 2:
                raise ModelLoadError(f"{name}: an FP8 tensor must be a 2-D <module>.weight, "
                                     f"got shape {list(w.shape)}")
            scales = {}
            wanted = [scheme.scale_name] + (["input_scale"] if scheme.static_input else [])
            for s in wanted:
                if f"{base}.{s}" not in index:
                    raise ModelLoadError(f"FP8 weight {name} has no scale {base}.{s}")
                scales[s] = read(f"{base}.{s}")
            _want_scale_shape(scheme, f"{base}.{scheme.scale_name}", w,
                              scales[scheme.scale_name])
            if scheme.static_input and scales["input_scale"].numel() != 1:
                raise ModelLoadError(f"{base}.input_scale has shape "
                                     f"{list(scales['input_scale'].shape)}, want one value")
            w.fp8_scales, w.fp8_scheme = scales, scheme
            yield name, w
