"""RMSNorm and GemmaRMSNorm with the fused residual-add form, as
vllm/model_executor/layers/layernorm.py.

`forward(x, residual)` returns (norm(x + residual), x + residual) so a decoder layer
carries the residual stream without extra adds (the GPU path fuses this in a kernel).
GemmaRMSNorm scales by (1 + w) in fp32 and casts once at the end, as Gemma's reference.
On CUDA both run the Triton kernels of kernels/rms_norm.py (vLLM's forward_cuda: ops.rms_norm,
ops.fused_add_rms_norm, the latter in place on x and residual); the torch form is the CPU
path and the kernels' reference.
"""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    weight_offset = 0.0  # the kernel computes x_norm * (weight + weight_offset)

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.variance_epsilon = eps

    def _scale(self) -> torch.Tensor:
        return self.weight.float()

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., hidden]; statistics in fp32 whatever the activation dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (xf * self._scale()).to(x.dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if x.is_cuda:
            return self._forward_cuda(x, residual)
        return self.forward_native(x, residual)

    def forward_native(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x


    def _forward_cuda(self, x: torch.Tensor, residual: torch.Tensor | None
                      ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        from libvllm.kernels.rms_norm import fused_add_rms_norm, rms_norm  # lazy: import cycle

        if residual is None:  # x: [..., hidden]; per-head norms (Qwen3 q/k) flatten the rows
            shape = x.shape
            return rms_norm(x.reshape(-1, shape[-1]), self.weight, self.variance_epsilon,
                            self.weight_offset).view(shape)
        fused_add_rms_norm(x, residual, self.weight, self.variance_epsilon, self.weight_offset)
        return x, residual


class GemmaRMSNorm(RMSNorm):
    """x * (1 + w): checkpoints store w around 0 (GGUF stores 1 + w; the loader undoes it)."""

    weight_offset = 1.0

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__(hidden_size, eps)
        self.weight.data.zero_()

    def _scale(self) -> torch.Tensor:
        return self.weight.float() + 1.0
