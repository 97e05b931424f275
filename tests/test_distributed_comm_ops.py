"""engine/distributed on two CPU processes with gloo, and the parallel layers against their
whole-weight forms.

Ports vLLM 0.33 tests/distributed/test_comm_ops.py (all_reduce_test_worker,
all_gather_test_worker: rank r holds arange * (r + 1)) from Ray + CUDA to
torch.multiprocessing + gloo, plus the executor's byte broadcast, and checks that
ColumnParallelLinear -> RowParallelLinear, QKVParallelLinear with a replicated kv head and
VocabParallelEmbedding + the LM head's gather give the tp=1 results.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp

from libvllm.engine.distributed.communication_op import (
    broadcast_bytes,
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)
from libvllm.engine.distributed.parallel_state import (
    destroy_distributed_environment,
    init_distributed_environment,
    initialize_model_parallel,
)
from libvllm.engine.executor.multiproc_executor import get_open_port
from libvllm.engine.layers.linear import ColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from libvllm.engine.layers.logits_processor import LogitsProcessor
from libvllm.engine.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

pytestmark = pytest.mark.slow
TP = 2


def _comm_ops(rank: int) -> None:
    n = 8
    all_tensors = [torch.arange(n, dtype=torch.float32) * (r + 1) for r in range(TP)]
    expected = torch.stack(all_tensors).sum(0)
    torch.testing.assert_close(tensor_model_parallel_all_reduce(all_tensors[rank].clone()),
                               expected)
    for dim in range(3):
        parts = [torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(r))
                 for r in range(TP)]
        torch.testing.assert_close(tensor_model_parallel_all_gather(parts[rank], dim),
                                   torch.cat(parts, dim))
    payload = b"scheduler output" * 100
    assert broadcast_bytes(payload if rank == 0 else None) == payload
    assert broadcast_bytes(b"" if rank == 0 else None) == b""


def _layers(rank: int) -> None:
    g = torch.Generator().manual_seed(0)  # the same full weights on every rank
    w1, w2 = torch.randn(12, 8, generator=g), torch.randn(8, 12, generator=g)
    b2 = torch.randn(8, generator=g)
    x = torch.randn(5, 8, generator=g)
    col, row = ColumnParallelLinear(8, 12), RowParallelLinear(12, 8, bias=True)
    assert col.weight_loader(col.weight, w1) == 12 * 8 // TP
    row.weight_loader(row.weight, w2)
    row.weight_loader(row.bias, b2)
    torch.testing.assert_close(row(col(x)), (x @ w1.T) @ w2.T + b2)
    # 2 heads, 1 kv head on 2 ranks: each rank keeps the kv head (vLLM's replication)
    qkv = QKVParallelLinear(8, 4, 2, 1)
    wq, wk, wv = (torch.randn(n, 8, generator=g) for n in (8, 4, 4))
    for shard, w in (("q", wq), ("k", wk), ("v", wv)):
        qkv.weight_loader(qkv.weight, w, shard)
    assert (qkv.num_heads, qkv.num_kv_heads, qkv.num_kv_head_replicas) == (1, 1, 2)
    torch.testing.assert_close(qkv(x), torch.cat([x @ wq[4 * rank:4 * rank + 4].T,
                                                  x @ wk.T, x @ wv.T], dim=-1))
    table = torch.randn(11, 8, generator=g)  # odd vocab: the last shard is padded
    emb, head = VocabParallelEmbedding(11, 8), ParallelLMHead(11, 8)
    emb.weight_loader(emb.weight, table)
    head.weight_loader(head.weight, table)
    ids = torch.tensor([0, 5, 6, 10])
    torch.testing.assert_close(emb(ids), table[ids])
    torch.testing.assert_close(LogitsProcessor(11)(head, x), x @ table.T)


def _worker(rank: int, port: int, check: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    init_distributed_environment(TP, rank, "gloo")
    initialize_model_parallel(TP)
    try:
        {"comm_ops": _comm_ops, "layers": _layers}[check](rank)
    finally:
        destroy_distributed_environment()


@pytest.mark.parametrize("check", ["comm_ops", "layers"])
def test_two_ranks(check):
    mp.spawn(_worker, args=(get_open_port(), check), nprocs=TP, join=True)
