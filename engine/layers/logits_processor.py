"""LogitsProcessor: hidden states -> fp32 logits, as vllm/model_executor/layers/
logits_processor.py (scale, then optional tanh soft cap: Gemma's final_logit_softcapping).
An LM head kept as GGUF blocks on CUDA (`gguf_weight`, engine/layers/linear.py) runs the
GGUF GEMV/GEMM kernels; a dense head with one row of hidden states on CUDA runs the Triton
GEMV kernels/gemv.py (engine/layers/linear.py dense_linear). With tensor parallelism each
rank computes its vocab shard's logits and they are all-gathered (vLLM's use_all_gather
path), so every rank samples from the same logits.
"""

from __future__ import annotations

import torch
from torch import nn

from libvllm.engine.distributed.communication_op import tensor_model_parallel_all_gather
from libvllm.engine.layers.linear import dense_linear
from libvllm.engine.layers.vocab_parallel_embedding import VocabParallelEmbedding


class LogitsProcessor(nn.Module):
    def __init__(self, vocab_size: int, soft_cap: float | None = None, scale: float = 1.0):
        super().__init__()
        self.vocab_size = vocab_size
        self.soft_cap = soft_cap
        self.scale = scale

    def forward(self, lm_head: VocabParallelEmbedding, hidden_states: torch.Tensor
                ) -> torch.Tensor:
        # hidden_states: [num_seqs, hidden] -> [num_seqs, vocab] fp32
        gguf_weight = getattr(lm_head, "gguf_weight", None)
        logits = (gguf_weight(hidden_states) if gguf_weight is not None
                  else dense_linear(hidden_states, lm_head.weight)).float()
        if lm_head.tp_size > 1:  # [num_seqs, vocab / tp] per rank -> [num_seqs, vocab]
            logits = tensor_model_parallel_all_gather(logits)[:, :self.vocab_size]
        if self.scale != 1.0:
            logits = logits * self.scale
        if self.soft_cap is not None:
            logits = torch.tanh(logits / self.soft_cap) * self.soft_cap
        return logits
