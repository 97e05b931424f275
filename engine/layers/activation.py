"""Gated activations, as vllm/model_executor/layers/activation.py: act(x[:d]) * x[d:].

get_act_and_mul_fn maps a Hugging Face `hidden_act` name to its gated module; an
unknown name is an UnsupportedError naming it. On CUDA, SiluAndMul runs the Triton kernel
kernels/activation.py (vLLM's forward_cuda -> ops.silu_and_mul); the torch form is the CPU
path and the kernel's reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from libvllm.engine.errors import UnsupportedError


class SiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [num_tokens, 2 * d] -> [num_tokens, d]
        if x.is_cuda and x.dim() == 2:
            from libvllm.kernels.activation import silu_and_mul  # lazy: kernels import this module

            return silu_and_mul(x)
        return self.forward_native(x)

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]


class GeluAndMul(nn.Module):
    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [num_tokens, 2 * d] -> [num_tokens, d]
        d = x.shape[-1] // 2
        return F.gelu(x[..., :d], approximate=self.approximate) * x[..., d:]


_ACTIVATIONS = {
    "silu": lambda: SiluAndMul(),
    "gelu": lambda: GeluAndMul("none"),
    "gelu_pytorch_tanh": lambda: GeluAndMul("tanh"),
    "gelu_new": lambda: GeluAndMul("tanh"),
}


def get_act_and_mul_fn(act_fn_name: str) -> nn.Module:
    make = _ACTIVATIONS.get(act_fn_name)
    if make is None:
        raise UnsupportedError(f"activation {act_fn_name!r} is not supported "
                               f"(supported: {', '.join(_ACTIVATIONS)})")
    return make()
