"""This rank's share of a quantized GGUF tensor kept as raw blocks (tensor parallelism on
the GPU path of engine/model_loader/gguf_quant.py), as vLLM's GGUF weight loading under
TP shards the quantized rows.

A GGUF matrix is [rows, row_bytes]: each output row is whole blocks of its input dim, so
output rows (column-parallel, vocab-parallel, the experts' gate/up) shard like dense rows;
the input dim (row-parallel, the experts' down) splits on block boundaries only, which
needs K / tp to be a multiple of the type's block size (else the caller loads it dense,
dequantized then sliced by the layer's weight loader). At tp 1 everything is whole.
"""

from __future__ import annotations

import torch
from torch import nn

from libvllm.engine.gguf.constants import GGML_TYPE_TRAITS, GGMLType
from libvllm.engine.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    RowParallelLinear,
)
from libvllm.engine.layers.vocab_parallel_embedding import VocabParallelEmbedding


def shard_rows(raw: torch.Tensor, start: int, size: int, dim: int = 0) -> torch.Tensor:
    """Rows [start, start + size) along `dim`, zero rows past the end (a padded vocab
    shard: zero blocks dequantize to zeros)."""
    # raw: [..., N, row_bytes] -> [..., size, row_bytes]
    stop = min(start + size, raw.shape[dim])
    part = raw.narrow(dim, start, max(0, stop - start))
    if part.shape[dim] < size:
        pad = list(raw.shape)
        pad[dim] = size - part.shape[dim]
        part = torch.cat([part, raw.new_zeros(pad)], dim=dim)
    return part.contiguous()


def shard_cols(raw: torch.Tensor, ggml_type: int, k: int, rank: int, tp: int
               ) -> torch.Tensor | None:
    """This rank's K / tp input columns of every row, cut on block boundaries; None when
    K / tp is not a whole number of blocks."""
    # raw: [..., N, row_bytes] -> [..., N, row_bytes / tp]
    block_size, _ = GGML_TYPE_TRAITS[GGMLType(ggml_type)]
    if k % tp or (k // tp) % block_size:
        return None
    part = raw.shape[-1] // tp
    return raw[..., rank * part:(rank + 1) * part].contiguous()


def shard_linear(module: nn.Module, raws: list[tuple[torch.Tensor, int]], k: int
                 ) -> list[tuple[torch.Tensor, int]] | None:
    """The checkpoint shards (raw [N_i, row_bytes], type) of one linear layer cut to this
    rank, or None when they cannot be cut on block boundaries."""
    if isinstance(module, VocabParallelEmbedding):  # an untied LM head
        return [(shard_rows(raw, module.vocab_start_index, module.num_embeddings_per_partition),
                 qtype) for raw, qtype in raws]
    if getattr(module, "tp_size", 1) == 1:
        return raws
    if isinstance(module, RowParallelLinear):
        cut = [(shard_cols(raw, qtype, k, module.tp_rank, module.tp_size), qtype)
               for raw, qtype in raws]
        return None if any(raw is None for raw, _ in cut) else cut
    if isinstance(module, MergedColumnParallelLinear):
        return [(shard_rows(raw, module._shard_rank(i) * module.output_sizes[i],
                            module.output_sizes[i]), qtype)
                for i, (raw, qtype) in enumerate(raws)]
    if isinstance(module, ColumnParallelLinear):
        n = module.output_size_per_partition
        return [(shard_rows(raw, module.tp_rank * n, n), qtype) for raw, qtype in raws]
    return raws  # ReplicatedLinear: whole on every rank
