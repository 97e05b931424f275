"""Checkpoint-name -> parameter weight loading shared by every model file.

Mirrors vllm/model_executor/models/utils.py (AutoWeightsLoader) and the load_weights loops
of vLLM's model files: a checkpoint tensor goes to an expert shard (FusedMoE mapping), a
stacked shard (q/k/v -> qkv_proj, gate/up -> gate_up_proj) or a whole parameter, through the
parameter's `weight_loader`. Unknown or duplicate names, wrong shapes and parameters left
(partly) unloaded are ModelLoadErrors naming the tensor. An fp8 checkpoint weight carries
its scales (engine/model_loader/fp8_weights.py): into an fp8 parameter they load into the
layer's `<param>_scale_inv` / `_scale` / input_scale parameters with the weight's shard
arguments (vLLM's scale weight loaders); into a dense parameter (a layer the model keeps
unquantized) the weight is dequantized first. A dense tensor for an fp8 parameter is an error.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from libvllm.engine.errors import ModelLoadError
from libvllm.engine.layers.kv_scales import load_kv_scale
from libvllm.engine.layers.linear import default_weight_loader
from libvllm.engine.layers.quantization.fp8_utils import dequantize_checkpoint_weight

# (param fragment, checkpoint fragment, shard id), as vLLM's stacked_params_mapping
STACKED_PARAMS_MAPPING = [
    (".qkv_proj", ".q_proj", "q"),
    (".qkv_proj", ".k_proj", "k"),
    (".qkv_proj", ".v_proj", "v"),
    (".gate_up_proj", ".gate_proj", 0),
    (".gate_up_proj", ".up_proj", 1),
]


def load_weights(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]],
                 expert_params_mapping: list[tuple[str, str, int, str]] | None = None
                 ) -> set[str]:
    """Load (checkpoint name, tensor) pairs into `model`; returns the parameter names."""
    params = dict(model.named_parameters())
    filled = dict.fromkeys(params, 0)  # elements written per parameter
    seen: set[tuple[str, tuple]] = set()
    tied = model.config.tie_word_embeddings
    for name, w in weights:
        if "rotary_emb.inv_freq" in name or (tied and name == "lm_head.weight"):
            continue
        if load_kv_scale(model, name, w):  # k_scale / v_scale: engine/layers/kv_scales.py
            continue
        target, args, shard = _route(name, expert_params_mapping or [])
        param = params.get(target)
        if param is None:
            raise ModelLoadError(f"unexpected weight {name!r} for {type(model).__name__}")
        if (target, shard) in seen:
            raise ModelLoadError(f"duplicate weight {name!r}")
        seen.add((target, shard))
        scales = getattr(w, "fp8_scales", None)
        fp8_param = param.dtype == torch.float8_e4m3fn
        if scales is not None and not fp8_param:
            w, scales = dequantize_checkpoint_weight(w), None
        elif scales is None and fp8_param:
            raise ModelLoadError(f"{name} has dtype {w.dtype}, want float8_e4m3fn: the "
                                 "quantization_config quantizes this layer")
        pairs = [(target, param, w, name)] + [
            (target[:-len("weight")] + s, params.get(target[:-len("weight")] + s), t,
             name[:-len("weight")] + s) for s, t in (scales or {}).items()]
        for tname, p, t, what in pairs:
            if p is None:
                raise ModelLoadError(f"unexpected weight {what!r} for {type(model).__name__}")
            loader = getattr(p, "weight_loader", default_weight_loader)
            try:
                written = loader(p, t, *args)  # sharding loaders: this rank's elements
            except ModelLoadError as e:
                raise ModelLoadError(f"{what}: {e}") from None
            filled[tname] += t.numel() if written is None else written
    partial = [n for n, p in params.items() if filled[n] != p.numel()]
    if partial:
        raise ModelLoadError(f"checkpoint is missing weights: {sorted(partial)[:5]}")
    return set(params)


def _route(name: str, expert_mapping: list[tuple[str, str, int, str]]
           ) -> tuple[str, tuple, tuple]:
    """Parameter name, extra weight_loader arguments and shard key for checkpoint `name`."""
    for param_frag, weight_frag, expert_id, shard_id in expert_mapping:
        if weight_frag in name:
            return (name.replace(weight_frag, param_frag), (name, shard_id, expert_id),
                    (shard_id, expert_id))
    for param_frag, weight_frag, shard_id in STACKED_PARAMS_MAPPING:
        if weight_frag in name:
            return name.replace(weight_frag, param_frag), (shard_id,), (shard_id,)
    return name, (), ()
