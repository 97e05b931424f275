"""Linear layers with shard-aware weight loaders, as vllm/model_executor/layers/linear.py.

ReplicatedLinear (whole weight), ColumnParallelLinear (output dim split by rank),
RowParallelLinear (input dim split, partial products all-reduced),
MergedColumnParallelLinear (gate_up: several outputs stacked on dim 0, each split) and
QKVParallelLinear (q, k, v stacked; kv heads replicated when fewer than ranks). At
tensor_parallel_size 1 the shapes are the whole ones. Each parameter carries a
`weight_loader(param, loaded, shard_id=None)` that takes the full checkpoint tensor, checks
its shape and copies this rank's slice; forward returns the output tensor only (vLLM also
returns the bias).
GGUFWeight is the quantized form of a weight on CUDA (vLLM's GGUFLinearMethod,
vllm/model_executor/layers/quantization/gguf.py): the raw GGUF blocks of each output shard
stay on the device and every matmul runs kernels/gguf_mmvq.py (a few tokens) or
kernels/gguf_gemm.py; a layer that has one
(`gguf_weight`) has no dense weight. A dense bf16/fp16 matmul of one row on CUDA (batch-1
decode) runs the Triton GEMV kernels/gemv.py (dense_linear), which beats cuBLAS there; a
gated MLP (gated_mlp) takes its SiLU-and-mul into the gate_up GEMV's epilogue there, or into
the q8_1 quantization of a GGUF down projection (forward_act_and_mul).
A layer of an FP8 checkpoint (or online FP8) has a `quant_method`
(engine/layers/quantization/fp8.py, vLLM's LinearMethodBase.apply) that owns its fp8
`weight` and scales on CUDA; those parameters keep their dtypes through `.to(dtype)`
(apply_keeping_dtypes).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from libvllm.engine.distributed.communication_op import tensor_model_parallel_all_reduce
from libvllm.engine.distributed.parallel_state import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
)
from libvllm.engine.errors import InvalidArgumentError, ModelLoadError
from libvllm.engine.layers.activation import SiluAndMul


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor) -> None:
    """Copy a whole tensor into `param`; a shape mismatch is a ModelLoadError. (Sharding
    loaders return the elements they wrote; None means all of `loaded`.)"""
    if tuple(param.shape) != tuple(loaded.shape):
        raise ModelLoadError(f"weight has shape {tuple(loaded.shape)}, want {tuple(param.shape)}")
    param.data.copy_(loaded.to(param.dtype))


def _one_row_gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether kernels/gemv.py takes this matmul: one bf16/fp16 row on CUDA."""
    return (x.is_cuda and x.dim() == 2 and x.shape[0] == 1 and x.stride(1) == 1
            and x.dtype in (torch.bfloat16, torch.float16) and weight.dtype == x.dtype
            and weight.is_contiguous() and (bias is None or bias.dtype == x.dtype))


def dense_linear(x: torch.Tensor, weight: torch.Tensor,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, or kernels/gemv.py dense_gemv for one bf16/fp16 row on CUDA."""
    # x: [num_tokens, in], weight: [out, in] -> [num_tokens, out]
    if _one_row_gemv(x, weight, bias):
        from libvllm.kernels.gemv import dense_gemv  # lazy: CUDA path only

        return dense_gemv(x, weight, bias)
    return F.linear(x, weight, bias)


def gated_mlp(x: torch.Tensor, gate_up_proj: nn.Module, down_proj: nn.Module,
              act_fn: nn.Module) -> torch.Tensor:
    """down_proj(act_fn(gate_up_proj(x))), a gated MLP (vLLM's LlamaMLP.forward). For one
    dense bf16/fp16 row on CUDA the gate_up GEMV stores silu(gate) * up itself
    (kernels/gemv.py silu_and_mul); otherwise the down projection takes the activation
    where it can (forward_act_and_mul)."""
    # x: [num_tokens, hidden] -> [num_tokens, hidden]
    if isinstance(act_fn, SiluAndMul) and gate_up_proj.gguf_weight is None and \
            _one_row_gemv(x, gate_up_proj.weight, gate_up_proj.bias):
        from libvllm.kernels.gemv import dense_gemv  # lazy: CUDA path only

        return down_proj(dense_gemv(x, gate_up_proj.weight, gate_up_proj.bias,
                                    silu_and_mul=True))
    return down_proj.forward_act_and_mul(gate_up_proj(x), act_fn)


def apply_keeping_dtypes(module: nn.Module, fn, recurse: bool, super_apply) -> nn.Module:
    """nn.Module._apply where parameters marked `keep_dtype` (fp8 weights, fp32 scales)
    only move to fn's device: `.to(device, dtype)` casts every other one."""
    kept = {n: p for n, p in module._parameters.items()
            if p is not None and getattr(p, "keep_dtype", False)}
    for n in kept:
        del module._parameters[n]
    super_apply(fn, recurse)
    for n, p in kept.items():
        device = fn(torch.empty(0, device=p.device)).device
        moved = nn.Parameter(p.data.to(device), requires_grad=False)
        moved.__dict__.update(p.__dict__)
        module._parameters[n] = moved
    return module


_WEIGHT_DEVICE: list[torch.device | None] = [None]  # None: the default device


@contextlib.contextmanager
def dense_weights_on(device: torch.device | str):
    """Linear layers' and experts' weights built inside go to `device` ("meta": never
    allocated; a quantized dummy model replaces them before materializing the rest)."""
    _WEIGHT_DEVICE[0] = torch.device(device)
    try:
        yield
    finally:
        _WEIGHT_DEVICE[0] = None


def materialize_meta_weights(model: nn.Module, device: torch.device) -> None:
    """Parameters left on the meta device (the dense ones) allocated, empty, on `device`."""
    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None and p.is_meta:
                new = nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device=device),
                                   requires_grad=False)
                new.__dict__.update(p.__dict__)  # weight_loader
                module._parameters[name] = new


def new_weight(*shape: int) -> nn.Parameter:
    """A layer weight of `shape` (on dense_weights_on's device when set)."""
    return nn.Parameter(torch.empty(*shape, device=_WEIGHT_DEVICE[0]), requires_grad=False)




class GGUFWeight(nn.Module):
    """Raw GGUF blocks of consecutive output shards: qweight{i} [N_i, row_bytes_i] uint8
    buffers (moved by .to(device), never cast), each of GGML type qtypes[i]. Up to
    MMVQ_MAX_M tokens the activations are quantized to q8_1 once and every shard of an
    int8-dot type runs kernels/gguf_mmvq.py into its columns of one output (vLLM's
    ggml_mul_mat_vec_a8); other shapes and types run kernels/gguf_gemm.py."""

    def __init__(self, shards: list[tuple[torch.Tensor, int]]) -> None:
        super().__init__()
        self.qtypes = [qtype for _, qtype in shards]
        self.sizes = [raw.shape[0] for raw, _ in shards]
        for i, (raw, _) in enumerate(shards):
            self.register_buffer(f"qweight{i}", raw)

    def forward(self, x: torch.Tensor, silu_and_mul: bool = False) -> torch.Tensor:
        # x: [num_tokens, in] ([num_tokens, 2 * in] gate | up with silu_and_mul)
        # -> [num_tokens, sum N_i]
        from libvllm.kernels.activation import silu_and_mul as act  # lazy: CUDA path only
        from libvllm.kernels.gguf_gemm import gguf_gemm
        from libvllm.kernels.gguf_mmvq import MMVQ_MAX_M, MMVQ_TYPES, gguf_mmvq_q8_1, quantize_q8_1

        mmvq = [x.shape[0] <= MMVQ_MAX_M and qtype in MMVQ_TYPES for qtype in self.qtypes]
        xq8 = quantize_q8_1(x, silu_and_mul) if any(mmvq) else None
        if silu_and_mul and not all(mmvq):
            x = act(x)  # rounded as the quantizer rounds it
        if len(self.qtypes) == 1 and not mmvq[0]:
            return gguf_gemm(x, self.qweight0, self.qtypes[0])
        out = torch.empty(x.shape[0], sum(self.sizes), dtype=x.dtype, device=x.device)
        start = 0
        for i, (qtype, n) in enumerate(zip(self.qtypes, self.sizes)):
            qweight = getattr(self, f"qweight{i}")
            if mmvq[i]:
                gguf_mmvq_q8_1(xq8, qweight, qtype, out[:, start:start + n])
            else:
                out[:, start:start + n] = gguf_gemm(x, qweight, qtype)
            start += n
        return out


class ReplicatedLinear(nn.Module):
    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        super().__init__()
        self.gguf_weight: GGUFWeight | None = None  # set by the GGUF loader on CUDA
        self.quant_method = None  # engine/layers/quantization/fp8.py Fp8LinearMethod
        self.input_size = input_size
        self.output_size = output_size
        self.weight = new_weight(output_size, input_size)  # [out, in]
        self.bias = new_weight(output_size) if bias else None
        for p in (self.weight, self.bias):
            if p is not None:
                p.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor,
                      shard_id: int | str | None = None) -> None:
        default_weight_loader(param, loaded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [num_tokens, in] -> [num_tokens, out]
        if self.quant_method is not None:
            return self.quant_method.apply(self, x, self.bias)
        if self.gguf_weight is not None:
            y = self.gguf_weight(x)
            return y if self.bias is None else y + self.bias
        return dense_linear(x, self.weight, self.bias)

    def _apply(self, fn, recurse=True):
        return apply_keeping_dtypes(self, fn, recurse, super()._apply)

    def forward_act_and_mul(self, gate_up: torch.Tensor, act_fn: nn.Module) -> torch.Tensor:
        """self(act_fn(gate_up)) for a gated MLP's down projection; SiLU-and-mul goes into
        the q8_1 quantization of GGUF weights (GGUFWeight, up to 8 tokens)."""
        # gate_up: [num_tokens, 2 * in] -> [num_tokens, out]
        if isinstance(act_fn, SiluAndMul) and self.gguf_weight is not None:
            y = self.gguf_weight(gate_up, silu_and_mul=True)  # quantized with the activation
            return y if self.bias is None else y + self.bias
        return self(act_fn(gate_up))


class MergedReplicatedLinear(ReplicatedLinear):
    """Several replicated projections' rows in one weight (one GEMV for all): shard `name`
    of `shard_sizes` fills its rows in order; a group fills the rows of consecutive shards
    from one checkpoint tensor through its loader (a row permutation). Loaded through a
    model's (param, checkpoint, None, shard) mapping (engine/models/utils.py load_weights):
    Qwen3-Next's router + shared-expert gate, the GDN in-projection."""

    def __init__(self, input_size: int, shard_sizes: dict[str, int],
                 groups: dict[str, tuple[tuple[str, ...], object]] | None = None) -> None:
        super().__init__(input_size, sum(shard_sizes.values()))
        self.offsets, off = {}, 0  # shard -> (first row, rows)
        for name, n in shard_sizes.items():
            self.offsets[name] = (off, n)
            off += n
        self.groups = groups or {}  # group -> (its shards, in order; loader of its tensor)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, weight_name: str = "",
                      shard_id: str | None = None, expert_id: int | None = None) -> None:
        loader = None
        if shard_id in self.groups:
            shards, loader = self.groups[shard_id]
            off, n = self.offsets[shards[0]][0], sum(self.offsets[s][1] for s in shards)
        elif shard_id in self.offsets:
            off, n = self.offsets[shard_id]
        else:
            raise ModelLoadError(f"unknown shard {shard_id!r}")
        dst = param.data[off:off + n]
        if tuple(loaded.shape) != tuple(dst.shape):
            raise ModelLoadError(f"shard {shard_id!r} has shape {tuple(loaded.shape)}, "
                                 f"want {tuple(dst.shape)}")
        dst.copy_((loaded if loader is None else loader(loaded)).to(param.dtype))


def divide(numerator: int, denominator: int, what: str = "size") -> int:
    """numerator / denominator, which must divide (vLLM's divide)."""
    if numerator % denominator:
        raise InvalidArgumentError(f"{what} {numerator} is not divisible by "
                                   f"tensor_parallel_size {denominator}")
    return numerator // denominator


def _copy_rows(param: nn.Parameter, dst: torch.Tensor, loaded: torch.Tensor, dim: int,
               index: int, what: str) -> int:
    """Copy slice `index` (of dst's size along `dim`) of the full `loaded` into dst."""
    size = dst.shape[dim]
    if loaded.shape[dim] < (index + 1) * size or \
            tuple(s for i, s in enumerate(loaded.shape) if i != dim % loaded.dim()) != \
            tuple(s for i, s in enumerate(dst.shape) if i != dim % dst.dim()):
        raise ModelLoadError(f"{what} has shape {tuple(loaded.shape)}, want {size} rows "
                             f"{index} of shape {tuple(dst.shape)} along dim {dim}")
    dst.copy_(loaded.narrow(dim, index * size, size).to(param.dtype))
    return dst.numel()


class ColumnParallelLinear(ReplicatedLinear):
    """Y = X A with A split along its output dim: this rank holds rows
    [rank * out / tp, (rank + 1) * out / tp) of the [out, in] weight (no gather_output)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        self.tp_rank = get_tensor_model_parallel_rank()
        self.tp_size = get_tensor_model_parallel_world_size()
        self.output_size_per_partition = divide(output_size, self.tp_size, "output size")
        super().__init__(input_size, self.output_size_per_partition, bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor,
                      shard_id: int | str | None = None) -> int | None:
        if self.tp_size == 1:
            return default_weight_loader(param, loaded)
        return _copy_rows(param, param.data, loaded, 0, self.tp_rank, "weight")


class RowParallelLinear(ReplicatedLinear):
    """Y = X A with A split along its input dim: this rank holds columns of the [out, in]
    weight and the partial products are all-reduced; the bias is added once (rank 0)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False,
                 reduce_results: bool = True) -> None:
        self.tp_rank = get_tensor_model_parallel_rank()
        self.tp_size = get_tensor_model_parallel_world_size()
        self.reduce_results = reduce_results
        self.input_size_per_partition = divide(input_size, self.tp_size, "input size")
        super().__init__(self.input_size_per_partition, output_size, bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor,
                      shard_id: int | str | None = None) -> int | None:
        if self.tp_size == 1 or param.dim() == 1:  # the bias is whole on every rank
            return default_weight_loader(param, loaded)
        return _copy_rows(param, param.data, loaded, 1, self.tp_rank, "weight")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [num_tokens, in / tp] -> [num_tokens, out]
        if self.tp_size == 1:
            return super().forward(x)
        if self.quant_method is not None:  # CUDA: the shard's FP8 weight
            return self._reduce(self.quant_method.apply(self, x, None))
        if self.gguf_weight is not None:  # CUDA: the shard's blocks stay quantized
            return self._reduce(self.gguf_weight(x))
        return self._reduce(dense_linear(x, self.weight, None))

    def forward_act_and_mul(self, gate_up: torch.Tensor, act_fn: nn.Module) -> torch.Tensor:
        # gate_up: [num_tokens, 2 * in / tp] -> [num_tokens, out]
        if self.tp_size == 1:
            return super().forward_act_and_mul(gate_up, act_fn)
        return self(act_fn(gate_up))

    def _reduce(self, partial: torch.Tensor) -> torch.Tensor:
        if self.bias is not None and self.tp_rank == 0:
            partial = partial + self.bias
        return tensor_model_parallel_all_reduce(partial) if self.reduce_results else partial


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Outputs of several projections stacked on dim 0, each split by rank; shard_id is the
    index."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False) -> None:
        tp = get_tensor_model_parallel_world_size()
        self.output_sizes = [divide(n, tp, "output size") for n in output_sizes]  # per rank
        super().__init__(input_size, sum(output_sizes), bias)

    def _shard_index(self, shard_id: int | str) -> int:
        return int(shard_id)

    def _shard_rank(self, i: int) -> int:
        return self.tp_rank

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor,
                      shard_id: int | str | None = None) -> int | None:
        if shard_id is None:
            return default_weight_loader(param, loaded)
        i = self._shard_index(shard_id)
        start, size = sum(self.output_sizes[:i]), self.output_sizes[i]
        dst = param.data[start:start + size]
        if self.tp_size == 1:
            if tuple(loaded.shape) != tuple(dst.shape):
                raise ModelLoadError(f"shard {shard_id!r} has shape {tuple(loaded.shape)}, "
                                     f"want {tuple(dst.shape)}")
            dst.copy_(loaded.to(param.dtype))
            return None
        return _copy_rows(param, dst, loaded, 0, self._shard_rank(i), f"shard {shard_id!r}")


class QKVParallelLinear(MergedColumnParallelLinear):
    """q, k, v projections stacked: shard ids "q", "k", "v". Heads split by rank; with
    fewer kv heads than ranks each kv head is replicated on tp / num_kv_heads ranks
    (vLLM's rule): rank r holds kv head r // replicas."""

    def __init__(self, hidden_size: int, head_size: int, total_num_heads: int,
                 total_num_kv_heads: int, bias: bool = False) -> None:
        tp = get_tensor_model_parallel_world_size()
        self.head_size = head_size
        self.num_heads = divide(total_num_heads, tp, "num_attention_heads")
        if tp >= total_num_kv_heads:
            self.num_kv_heads = 1
            self.num_kv_head_replicas = divide(tp, total_num_kv_heads, "num_key_value_heads")
        else:
            self.num_kv_heads = divide(total_num_kv_heads, tp, "num_key_value_heads")
            self.num_kv_head_replicas = 1
        q, kv = self.num_heads * head_size, self.num_kv_heads * head_size
        # the parent divides each output by tp again: hand it the per-rank sizes times tp
        super().__init__(hidden_size, [q * tp, kv * tp, kv * tp], bias)

    def _shard_index(self, shard_id: int | str) -> int:
        return {"q": 0, "k": 1, "v": 2}[shard_id]

    def _shard_rank(self, i: int) -> int:
        return self.tp_rank if i == 0 else self.tp_rank // self.num_kv_head_replicas
