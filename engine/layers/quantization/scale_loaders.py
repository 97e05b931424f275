"""Weight loaders of FP8 scale parameters: a checkpoint shard's scales into this rank's
rows of a merged / tensor-parallel layer's scale.

Mirrors vllm/model_executor/parameter.py (BlockQuantScaleParameter,
ChannelQuantScaleParameter, PerTensorScaleParameter) and the scale branches of
vllm/model_executor/layers/linear.py's and fused_moe/layer.py's weight loaders: a block
scale_inv shard [ceil(N_i/bn), ceil(K/bk)] fills rows start_i/bn.. of the stacked
[ceil(N/bn), ceil(K/bk)] (shards but the last fill whole blocks: validate_fp8_block_shape),
a per-channel scale [N_i, 1] the shard's rows, a per-tensor scale (and a static input
scale) slot i of a [num_shards] vector. Under tensor parallelism each takes this rank's
slice in the same units as its weight (block rows / columns of whole blocks).
"""

from __future__ import annotations

import torch
from torch import nn

from libvllm.engine.errors import ModelLoadError
from libvllm.engine.layers.linear import ColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from libvllm.engine.layers.quantization.base_config import WeightScheme
from libvllm.engine.layers.quantization.fp8_utils import cdiv


def linear_widths(layer: nn.Module) -> list[int]:
    """This rank's output rows of each checkpoint shard of a linear layer."""
    return list(getattr(layer, "output_sizes", None) or [layer.output_size])


def _splits(layer: nn.Module) -> tuple[int, bool, bool]:
    tp = getattr(layer, "tp_size", 1)
    return tp, tp > 1 and isinstance(layer, ColumnParallelLinear), \
        tp > 1 and isinstance(layer, RowParallelLinear)


def _check(what: str, loaded: torch.Tensor, want: tuple[int, ...]) -> None:
    if tuple(loaded.shape) != want:
        raise ModelLoadError(f"{what} has shape {tuple(loaded.shape)}, want {want}")


def load_linear_scale(layer: nn.Module, scheme: WeightScheme, input_scale: bool,
                      param: nn.Parameter, loaded: torch.Tensor,
                      shard_id: int | str | None = None) -> int:
    """One checkpoint shard's scale into `param`; returns the elements written."""
    widths = linear_widths(layer)
    if shard_id is None:
        i, start, rank = 0, 0, getattr(layer, "tp_rank", 0)
    else:
        i = layer._shard_index(shard_id)
        start, rank = sum(widths[:i]), layer._shard_rank(i)
    size = widths[i]
    tp, col, row = _splits(layer)
    # the checkpoint shard spans `parts` rank slices (kv heads replicated: fewer)
    parts = tp // layer.num_kv_head_replicas \
        if isinstance(layer, QKVParallelLinear) and i > 0 else tp
    loaded = loaded.float()
    if input_scale or scheme.kind == "tensor":
        _check("scale", loaded.reshape(-1), (1,))
        param.data[i] = loaded.reshape(())
        return 1
    if scheme.kind == "channel":
        full = size * parts if col else size
        loaded = loaded.reshape(-1) if loaded.dim() == 2 and loaded.shape[1] == 1 else loaded
        _check("per-channel scale", loaded, (full,))
        param.data[start:start + size] = loaded.narrow(0, rank * size if col else 0, size)
        return size
    bn, bk = scheme.block
    k = layer.input_size
    rows, cols = cdiv(size * (parts if col else 1), bn), cdiv(k * (tp if row else 1), bk)
    _check("block scale_inv", loaded, (rows, cols))
    if col:
        loaded = loaded.narrow(0, rank * size // bn, cdiv(size, bn))
    if row:
        loaded = loaded.narrow(1, layer.tp_rank * k // bk, cdiv(k, bk))
    dst = param.data[start // bn:start // bn + cdiv(size, bn)]
    _check("block scale_inv slice", loaded, tuple(dst.shape))
    dst.copy_(loaded)
    return dst.numel()


def load_moe_scale(layer: nn.Module, scheme: WeightScheme, input_scale: bool,
                   param: nn.Parameter, loaded: torch.Tensor, weight_name: str,
                   shard_id: str, expert_id: int | None = None) -> int:
    """One expert's w1 / w3 / w2 scale into the stacked [E, ...] scale parameter."""
    if expert_id is None:
        raise ModelLoadError(f"{weight_name}: FP8 expert scales must be stored per expert")
    i, tp, rank = layer.intermediate_size, layer.tp_size, layer.tp_rank
    loaded = loaded.float()
    if input_scale or scheme.kind == "tensor":
        _check(f"{weight_name} scale", loaded.reshape(-1), (1,))
        dst = param.data[expert_id]
        if shard_id != "w2":
            dst = dst[0 if shard_id == "w1" else 1]
        dst.copy_(loaded.reshape(()))
        return 1
    w13 = shard_id != "w2"
    if scheme.kind == "channel":
        rows = i * tp if w13 else param.shape[1]
        loaded = loaded.reshape(-1) if loaded.dim() == 2 and loaded.shape[1] == 1 else loaded
        _check(f"{weight_name} per-channel scale", loaded, (rows,))
        if w13:
            loaded = loaded.narrow(0, rank * i, i)
            param.data[expert_id, (0 if shard_id == "w1" else i):][:i] = loaded
        else:
            param.data[expert_id] = loaded
        return loaded.numel()
    bn, bk = scheme.block
    if w13:
        _check(f"{weight_name} block scale_inv", loaded, (cdiv(i * tp, bn), param.shape[2]))
        loaded = loaded.narrow(0, rank * i // bn, i // bn)
        off = 0 if shard_id == "w1" else i // bn
        dst = param.data[expert_id, off:off + i // bn]
    else:
        _check(f"{weight_name} block scale_inv", loaded, (param.shape[1], cdiv(i * tp, bk)))
        loaded = loaded.narrow(1, rank * i // bk, cdiv(i, bk))
        dst = param.data[expert_id]
    dst.copy_(loaded)
    return dst.numel()
