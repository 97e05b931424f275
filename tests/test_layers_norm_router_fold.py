"""The norm + router fold of batch-1 decode (engine/models/qwen3_moe.py
Qwen3MoeDecoderLayer._mlp_block -> kernels/rms_norm_gemv.py) wired through the model.

Off CUDA the layers never fold (the CPU path is the torch one); these tests make the
attention and the RMSNorms take their kernel paths (use_kernels, RMSNorm._forward_cuda)
and let the one-row GEMV dispatch accept CPU tensors, so that the kernels run under the
Triton interpreter. Oracles: a one-token decode step of a tiny Qwen3-MoE model (sparse
layers 0 and 2, a dense MLP in layer 1) with the fold equals, bit for bit (logits), the
same step with LIBVLLM_DISABLE_NORM_ROUTER_FOLD=1 (kernels/rms_norm.py fused_add_rms_norm,
then the router's kernels/gemv.py dense_gemv), and the plain torch path within fp32
tolerance; the fold runs once per sparse layer, the router GEMV never. Two tokens, the env
var and a GGUF router fall back to the unfused path. No upstream test: vLLM has no such
fusion, so the oracles are the unfused kernels and the torch path.
"""

from __future__ import annotations

import pytest
import torch
from test_kernels_common import (
    DEVICE,
    ON_CUDA,
    assert_close,
    decode_metadata,
    fold_switch,
    one_row_gemv_on_cpu,
    spy_calls,
    tiny_model,
)

import libvllm.engine.layers.attention as attention
import libvllm.engine.layers.linear as linear
import libvllm.engine.models.qwen3_moe as qwen3_moe
import libvllm.kernels.gemv
import libvllm.kernels.rms_norm_gemv
from libvllm.engine.layers.layernorm import RMSNorm
from libvllm.engine.models.config import ModelArchConfig
from libvllm.engine.models.qwen3_moe import Qwen3MoeForCausalLM

pytestmark = pytest.mark.skipif(ON_CUDA, reason="the interpreter on CPU")

BS, NQ, NKV, HD, E = 4, 4, 2, 16, 4  # KV block size; the tiny model's heads; experts
SPARSE = [0, 2]  # layer 1 is in mlp_only_layers


@pytest.fixture
def calls(monkeypatch) -> dict[str, list]:
    """x shapes of each fused-kernel call ("fold") and of each router GEMV ("router")."""
    seen: dict[str, list] = {"fold": [], "router": []}
    spy_calls(monkeypatch, libvllm.kernels.rms_norm_gemv, "fused_add_rms_norm_gemv",
              lambda x, *a, **kw: seen["fold"].append(tuple(x.shape)))
    spy_calls(monkeypatch, libvllm.kernels.gemv, "dense_gemv", lambda x, w, *a, **kw: (
        seen["router"].append(tuple(x.shape)) if w.shape == (E, 64) else None))
    return seen


def _kernel_path(monkeypatch, fold: bool) -> None:
    """The attention's and the norms' kernel paths and the one-row GEMV on CPU; the fold
    on or off. The norms too, as on CUDA: the torch norm's fp32 mean sums in another order
    than the interpreter's tl.sum (about half of random 64-wide rows' variances differ in
    the last bit), so only the norm kernel the fold replaces gives equal logits."""
    monkeypatch.setattr(attention, "use_kernels", lambda q: True)
    monkeypatch.setattr(RMSNorm, "forward", lambda self, x, residual=None:
                        self._forward_cuda(x, residual))
    monkeypatch.setattr(linear, "_one_row_gemv", one_row_gemv_on_cpu)
    fold_switch(monkeypatch, "LIBVLLM_DISABLE_NORM_ROUTER_FOLD",
                qwen3_moe._norm_router_fold_enabled, fold)


@pytest.fixture(autouse=True)
def _fold_flag_fresh():
    qwen3_moe._norm_router_fold_enabled.cache_clear()
    yield
    qwen3_moe._norm_router_fold_enabled.cache_clear()


def _tiny() -> Qwen3MoeForCausalLM:
    cfg = ModelArchConfig("qwen3_moe", "t", 50, 64, 96, 3, NQ, NKV, HD, 1e-6, 1e4, 256, False,
                          architectures=("Qwen3MoeForCausalLM",), num_experts=E,
                          num_experts_per_tok=2, moe_intermediate_size=32,
                          mlp_only_layers=(1,))
    return tiny_model(Qwen3MoeForCausalLM, cfg)


def _decode_step(model, positions: list[int]) -> torch.Tensor:
    """[len(positions), vocab] logits of tokens at `positions` (context 0.. in random
    caches)."""
    torch.manual_seed(1)
    for layer in model.model.layers:
        layer.self_attn.attn.kv_cache = torch.randn(2, 4, BS, NKV, HD, device=DEVICE)
    ids = torch.tensor([7, 9][:len(positions)], device=DEVICE)
    with torch.inference_mode():
        hidden = model(ids, torch.tensor(positions, device=DEVICE), decode_metadata(positions, BS))
        return model.compute_logits(hidden)


def test_one_token_decode_with_the_fold_equals_without(monkeypatch, calls) -> None:
    model = _tiny()
    assert [isinstance(layer.mlp, qwen3_moe.Qwen3MoeSparseMoeBlock)
            for layer in model.model.layers] == [True, False, True]
    logits = {}
    for path in ("torch", "unfused", "folded"):
        if path != "torch":
            _kernel_path(monkeypatch, fold=path == "folded")
        logits[path] = _decode_step(model, [5])
        assert calls["fold"] == [(1, 64)] * len(SPARSE) * (path == "folded")
        assert calls["router"] == [(1, 64)] * len(SPARSE) * (path == "unfused")
        calls["fold"].clear()
        calls["router"].clear()
    assert torch.equal(logits["folded"], logits["unfused"])
    assert_close(logits["folded"], logits["torch"], atol=1e-4, rtol=1e-4)


def test_two_tokens_never_fold(monkeypatch, calls) -> None:
    """With the fold on (the switch off: the "unfused" run above). The fold off would run
    the same two-row path again."""
    model = _tiny()
    _kernel_path(monkeypatch, fold=True)
    _decode_step(model, [4, 5])
    assert calls["fold"] == []  # two rows: the norm kernel, then the router GEMM


def test_gguf_router_does_not_fold(monkeypatch, calls) -> None:
    model = _tiny()
    _kernel_path(monkeypatch, fold=True)
    for i in SPARSE:
        gate = model.model.layers[i].mlp.gate
        gate.gguf_weight = lambda x, gate=gate: linear.dense_linear(x, gate.weight)  # stand-in
    _decode_step(model, [5])
    assert calls["fold"] == []
    assert calls["router"] == [(1, 64)] * len(SPARSE)
