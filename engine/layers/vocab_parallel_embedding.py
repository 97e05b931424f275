"""Token embedding and LM head, as vllm/model_executor/layers/vocab_parallel_embedding.py.

Single-device forms of VocabParallelEmbedding / ParallelLMHead; `tie_weights` makes the
head share the embedding's parameter (tied checkpoints carry no lm_head.weight).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers.linear import default_weight_loader


class VocabParallelEmbedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim),
                                   requires_grad=False)  # [vocab, hidden]
        self.weight.weight_loader = default_weight_loader

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # input_ids: [num_tokens] -> [num_tokens, hidden]
        return F.embedding(input_ids, self.weight)


class ParallelLMHead(VocabParallelEmbedding):
    def tie_weights(self, embed_tokens: VocabParallelEmbedding) -> VocabParallelEmbedding:
        return embed_tokens
