"""Token embedding and LM head, as vllm/model_executor/layers/vocab_parallel_embedding.py.

VocabParallelEmbedding splits the vocabulary rows by rank: rank r holds rows
[r * ceil(vocab / tp), ...) of the [vocab, hidden] table (the last shard zero-padded;
vLLM also pads the vocab to a multiple of 64, which we do not, so tp 1 keeps the whole
table's shape). Ids outside the rank's shard embed to zero and the ranks' rows are
all-reduced. ParallelLMHead is the same table used as the output projection (its logits
are all-gathered by engine/layers/logits_processor.py); `tie_weights` makes the head share
the embedding's parameter (tied checkpoints carry no lm_head.weight).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from libvllm.engine.distributed.communication_op import tensor_model_parallel_all_reduce
from libvllm.engine.distributed.parallel_state import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
)
from libvllm.engine.errors import ModelLoadError
from libvllm.engine.layers.linear import default_weight_loader


class VocabParallelEmbedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.tp_rank = get_tensor_model_parallel_rank()
        self.tp_size = get_tensor_model_parallel_world_size()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.num_embeddings_per_partition = -(-num_embeddings // self.tp_size)
        self.vocab_start_index = self.tp_rank * self.num_embeddings_per_partition
        self.vocab_end_index = min(num_embeddings,
                                   self.vocab_start_index + self.num_embeddings_per_partition)
        self.weight = nn.Parameter(torch.empty(self.num_embeddings_per_partition,
                                               embedding_dim),
                                   requires_grad=False)  # [vocab / tp, hidden]
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> int | None:
        if self.tp_size == 1:
            return default_weight_loader(param, loaded)
        if tuple(loaded.shape) != (self.num_embeddings, self.embedding_dim):
            raise ModelLoadError(f"weight has shape {tuple(loaded.shape)}, want "
                                 f"{(self.num_embeddings, self.embedding_dim)}")
        n = self.vocab_end_index - self.vocab_start_index
        param.data.zero_()
        param.data[:n].copy_(loaded[self.vocab_start_index:self.vocab_end_index]
                             .to(param.dtype))
        return param.numel()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # input_ids: [num_tokens] -> [num_tokens, hidden]
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        outside = (input_ids < self.vocab_start_index) | (input_ids >= self.vocab_end_index)
        local = torch.where(outside, 0, input_ids - self.vocab_start_index)
        out = F.embedding(local, self.weight).masked_fill(outside[:, None], 0)
        return tensor_model_parallel_all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    def tie_weights(self, embed_tokens: VocabParallelEmbedding) -> VocabParallelEmbedding:
        return embed_tokens
