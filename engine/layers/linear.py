"""Linear layers with shard-aware weight loaders, as vllm/model_executor/layers/linear.py.

Single-device forms of vLLM's classes, same names so tensor parallelism can slot in:
ReplicatedLinear / RowParallelLinear (one weight), MergedColumnParallelLinear (gate_up:
several outputs stacked on dim 0) and QKVParallelLinear (q, k, v stacked). Each parameter
carries a `weight_loader(param, loaded, shard_id=None)` that checks the checkpoint shape
before copying; forward returns the output tensor only (vLLM also returns the bias).
GGUFWeight is the quantized form of a weight on CUDA (vLLM's GGUFLinearMethod,
vllm/model_executor/layers/quantization/gguf.py): the raw GGUF blocks of each output shard
stay on the device and every matmul runs kernels/gguf_gemm.py; a layer that has one
(`gguf_weight`) has no dense weight. A dense bf16/fp16 matmul of one row on CUDA (batch-1
decode) runs the Triton GEMV kernels/gemv.py (dense_linear), which beats cuBLAS there; a
gated MLP's down projection takes its SiLU-and-mul into that GEMV (forward_act_and_mul).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.errors import ModelLoadError
from engine.layers.activation import SiluAndMul


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor) -> None:
    """Copy a whole tensor into `param`; a shape mismatch is a ModelLoadError."""
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
        from kernels.gemv import dense_gemv  # lazy: CUDA path only

        return dense_gemv(x, weight, bias)
    return F.linear(x, weight, bias)


def _new_param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


class GGUFWeight(nn.Module):
    """Raw GGUF blocks of consecutive output shards: qweight{i} [N_i, row_bytes_i] uint8
    buffers (moved by .to(device), never cast), each of GGML type qtypes[i]."""

    def __init__(self, shards: list[tuple[torch.Tensor, int]]) -> None:
        super().__init__()
        self.qtypes = [qtype for _, qtype in shards]
        for i, (raw, _) in enumerate(shards):
            self.register_buffer(f"qweight{i}", raw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [num_tokens, in] -> [num_tokens, sum N_i]
        from kernels.gguf_gemm import gguf_gemm  # lazy: CUDA path only

        outs = [gguf_gemm(x, getattr(self, f"qweight{i}"), qtype)
                for i, qtype in enumerate(self.qtypes)]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)


class ReplicatedLinear(nn.Module):
    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        super().__init__()
        self.gguf_weight: GGUFWeight | None = None  # set by the GGUF loader on CUDA
        self.input_size = input_size
        self.output_size = output_size
        self.weight = _new_param(output_size, input_size)  # [out, in]
        self.bias = _new_param(output_size) if bias else None
        for p in (self.weight, self.bias):
            if p is not None:
                p.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor,
                      shard_id: int | str | None = None) -> None:
        default_weight_loader(param, loaded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [num_tokens, in] -> [num_tokens, out]
        if self.gguf_weight is not None:
            y = self.gguf_weight(x)
            return y if self.bias is None else y + self.bias
        return dense_linear(x, self.weight, self.bias)

    def forward_act_and_mul(self, gate_up: torch.Tensor, act_fn: nn.Module) -> torch.Tensor:
        """self(act_fn(gate_up)) for a gated MLP's down projection; SiLU-and-mul of one row
        on CUDA runs inside the GEMV (kernels/gemv.py silu_and_mul), one kernel for two."""
        # gate_up: [num_tokens, 2 * in] -> [num_tokens, out]
        if isinstance(act_fn, SiluAndMul) and self.gguf_weight is None and \
                _one_row_gemv(gate_up, self.weight, self.bias):
            from kernels.gemv import dense_gemv  # lazy: CUDA path only

            return dense_gemv(gate_up, self.weight, self.bias, silu_and_mul=True)
        return self(act_fn(gate_up))


class RowParallelLinear(ReplicatedLinear):
    pass


class MergedColumnParallelLinear(ReplicatedLinear):
    """Outputs of several projections stacked on dim 0; shard_id is the index."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False) -> None:
        self.output_sizes = list(output_sizes)
        super().__init__(input_size, sum(output_sizes), bias)

    def _shard_index(self, shard_id: int | str) -> int:
        return int(shard_id)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor,
                      shard_id: int | str | None = None) -> None:
        if shard_id is None:
            return default_weight_loader(param, loaded)
        i = self._shard_index(shard_id)
        start, size = sum(self.output_sizes[:i]), self.output_sizes[i]
        want = (size, *param.shape[1:])
        if tuple(loaded.shape) != want:
            raise ModelLoadError(f"shard {shard_id!r} has shape {tuple(loaded.shape)}, "
                                 f"want {want}")
        param.data[start:start + size].copy_(loaded.to(param.dtype))


class QKVParallelLinear(MergedColumnParallelLinear):
    """q, k, v projections stacked: shard ids "q", "k", "v"."""

    def __init__(self, hidden_size: int, head_size: int, total_num_heads: int,
                 total_num_kv_heads: int, bias: bool = False) -> None:
        self.head_size = head_size
        self.num_heads = total_num_heads
        self.num_kv_heads = total_num_kv_heads
        q, kv = total_num_heads * head_size, total_num_kv_heads * head_size
        super().__init__(hidden_size, [q, kv, kv], bias)

    def _shard_index(self, shard_id: int | str) -> int:
        return {"q": 0, "k": 1, "v": 2}[shard_id]
