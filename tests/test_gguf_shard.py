"""GGUF blocks kept quantized under tensor parallelism (engine/model_loader/gguf_shard.py,
gguf_quant.py): on each of two gloo ranks, every GGUFWeight buffer dequantizes to exactly
the rank's slice of the dense-loaded weight (output rows: q/k/v with the Llama un-permute,
gate/up, the padded vocab shard of the LM head; input blocks: o_proj), and a row-parallel
weight whose K / tp is not whole blocks (down_proj, K 96 / 2 = 48 with 32-value blocks)
falls back to dense. The GGUF kernels themselves run on CUDA only; this checks the bytes.
"""

from __future__ import annotations

import os

import gguf
import pytest
import torch
import torch.multiprocessing as mp

from libvllm.engine.distributed.parallel_state import (
    destroy_distributed_environment,
    init_distributed_environment,
    initialize_model_parallel,
)
from libvllm.engine.executor.multiproc_executor import get_open_port
from libvllm.engine.gguf.dequant import dequantize
from libvllm.engine.model_loader import load_gguf_model
from libvllm.engine.model_loader.gguf_shard import shard_cols
from tests.test_models_parity import make_hf_model, write_gguf_twin
from tests.test_tensor_parallel import _add_q8_0

pytestmark = pytest.mark.slow
TP = 2


def _check(rank: int, path: str) -> None:
    quant, _, r1 = load_gguf_model(path, keep_quantized=True)
    dense, _, r2 = load_gguf_model(path)
    r1.close()
    r2.close()
    dense_params = dict(dense.named_modules())
    kept = 0
    for name, module in quant.named_modules():
        w = getattr(module, "gguf_weight", None)
        if w is None:
            continue
        want = dense_params[name].weight  # [N / tp or N, K / tp or K]
        got = torch.cat([dequantize(getattr(w, f"qweight{i}").reshape(-1), qtype,
                                    getattr(w, f"qweight{i}").shape[0] * want.shape[1])
                         .view(-1, want.shape[1]) for i, qtype in enumerate(w.qtypes)])
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        kept += 1
    layers = quant.model.layers
    assert kept == 1 + 3 * len(layers)  # lm_head + qkv, o, gate_up per layer
    assert all(layer.mlp.down_proj.gguf_weight is None for layer in layers)


def _worker(rank: int, port: int, path: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    init_distributed_environment(TP, rank, "gloo")
    initialize_model_parallel(TP)
    try:
        _check(rank, path)
    finally:
        destroy_distributed_environment()


def test_raw_blocks_shard_as_dense(tmp_path):
    pytest.importorskip("triton")  # kernels.gguf_tiles lists the types with a kernel
    path = str(tmp_path / "tiny.gguf")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(gguf.GGUFWriter, "add_tensor", _add_q8_0(gguf.GGUFWriter.add_tensor))
        write_gguf_twin(make_hf_model("llama"), "llama", path)
    mp.spawn(_worker, args=(get_open_port(), path), nprocs=TP, join=True)


def test_input_dim_splits_on_block_boundaries_only():
    raw = torch.arange(2 * 4 * 34, dtype=torch.int32).to(torch.uint8).view(2, 4 * 34)
    q8_0 = 8  # 32 values in 34 bytes
    assert torch.equal(shard_cols(raw, q8_0, 128, 1, 2), raw[:, 68:])
    assert shard_cols(raw, q8_0, 128, 0, 8) is None  # 16 values: half a block
