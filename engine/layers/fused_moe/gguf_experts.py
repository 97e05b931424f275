"""A layer's experts kept as raw GGUF blocks on CUDA, and fused_experts over them.

Mirrors vllm/model_executor/layers/quantization/gguf.py (GGUFMoEMethod: ffn_gate_exps /
ffn_up_exps merged as w13 and ffn_down_exps as w2, raw blocks per expert; _fused_moe_gguf:
the quantized MoE kernels for small batches, every expert dequantized beyond). Here the
small-batch kernel is kernels/moe_gguf.py (Triton; decodes each routed expert's tiles once
per 16-pair block) and is used while the pairs average at most 16 per expert
(M * top_k <= 16 * E: decode and small prefill chunks); larger batches dequantize all
experts of the layer to the activation dtype (kernels/gguf_gemm.py gguf_dequantize, a
transient buffer) and run the dense Triton path (triton_experts.py). Gate and up
projections of different GGML types are launched separately into their column halves.
"""

from __future__ import annotations

import torch
from torch import nn

from libvllm.engine.layers.fused_moe.triton_experts import (
    _prepare_expert_assignment,
    fused_experts_triton,
)

# pairs per expert up to which the quantized kernel runs (one 16-row block per expert)
QUANTIZED_MAX_PAIRS_PER_EXPERT = 16


class GGUFExperts(nn.Module):
    """w13 shards: [(raw [E, N_i, row_bytes] uint8, ggml type)] in gate | up row order;
    w2: (raw [E, H, row_bytes], type). Buffers move with .to(device), never cast."""

    def __init__(self, w13: list[tuple[torch.Tensor, int]], w2: tuple[torch.Tensor, int]
                 ) -> None:
        super().__init__()
        self.w13_types = [qtype for _, qtype in w13]
        for i, (raw, _) in enumerate(w13):
            self.register_buffer(f"w13_q{i}", raw)
        self.register_buffer("w2_q", w2[0])
        self.w2_type = w2[1]

    def w13_shards(self) -> list[tuple[torch.Tensor, int]]:
        return [(getattr(self, f"w13_q{i}"), t) for i, t in enumerate(self.w13_types)]

    def dequantized(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(w13 [E, 2I, H], w2 [E, H, I]) in `dtype`."""
        from libvllm.kernels.gguf_gemm import gguf_dequantize  # lazy: CUDA path only

        def dense(raw: torch.Tensor, qtype: int) -> torch.Tensor:
            e, n, _ = raw.shape
            return gguf_dequantize(raw.view(e * n, -1), qtype, dtype).view(e, n, -1)

        w13 = torch.cat([dense(raw, t) for raw, t in self.w13_shards()], dim=1)
        return w13, dense(self.w2_q, self.w2_type)

    def forward(self, hidden_states: torch.Tensor, topk_weights: torch.Tensor,
                topk_ids: torch.Tensor, act: nn.Module) -> torch.Tensor:
        # hidden_states: [M, H]; topk_*: [M, k] -> [M, H]
        from libvllm.kernels.moe_gguf import MOE_GGUF_CONFIG, invoke_fused_moe_gguf_kernel

        m, h = hidden_states.shape
        num_experts, top_k = self.w2_q.shape[0], topk_ids.shape[1]
        if m * top_k > QUANTIZED_MAX_PAIRS_PER_EXPERT * num_experts:
            w13, w2 = self.dequantized(hidden_states.dtype)
            return fused_experts_triton(hidden_states, w13, w2, topk_weights, topk_ids, act)
        x = hidden_states.contiguous()
        weights = topk_weights.float().contiguous()
        sorted_ids, expert_ids, post_pad = _prepare_expert_assignment(
            topk_ids, MOE_GGUF_CONFIG, num_experts)
        n2 = sum(raw.shape[1] for raw, _ in self.w13_shards())
        cache1 = torch.empty(m * top_k, n2, dtype=x.dtype, device=x.device)  # gate | up
        col = 0
        for raw, qtype in self.w13_shards():
            invoke_fused_moe_gguf_kernel(x, raw, qtype, cache1[:, col:col + raw.shape[1]],
                                         weights, sorted_ids, expert_ids, post_pad, False,
                                         top_k)
            col += raw.shape[1]
        cache2 = act(cache1)  # [M * k, I]
        cache3 = torch.empty(m * top_k, h, dtype=x.dtype, device=x.device)
        invoke_fused_moe_gguf_kernel(cache2, self.w2_q, self.w2_type, cache3, weights,
                                     sorted_ids, expert_ids, post_pad, True, 1)
        return cache3.view(m, top_k, h).sum(dim=1)
