"""The qkv + RoPE + KV-cache fold of batch-1 decode (engine/layers/attention.py
Attention.forward_qkv -> kernels/gemv_rope_cache.py) wired through the decoder layers.

Off CUDA the layers never fold (the CPU path is the torch one); these tests make the
attention take its kernel path (use_kernels) and let the one-row GEMV dispatch accept CPU
tensors, so that the kernels run under the Triton interpreter. Oracles: a one-token decode
step of tiny Llama, Qwen2 (qkv bias) and Mixtral models with the fold equals, bit for bit
(logits and every layer's KV cache), the same step with LIBVLLM_DISABLE_QKV_ROPE_FOLD=1
(the qkv GEMV, then kernels/rotary_cache.py), and the plain torch path within fp32
tolerance; Qwen3 and Gemma 3 (per-head q/k norms) never fold. At the layer: two tokens,
the env var, q/k norms, partial rotary, a profile run (no metadata) and a GGUF weight
fall back to the unfused path. No upstream test: vLLM has no such fusion.
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
import libvllm.kernels.gemv_rope_cache
import libvllm.kernels.rotary_cache
from libvllm.engine.layers.attention import Attention
from libvllm.engine.layers.layernorm import RMSNorm
from libvllm.engine.layers.linear import QKVParallelLinear
from libvllm.engine.layers.rotary_embedding import RotaryEmbedding
from libvllm.engine.models.config import ModelArchConfig
from libvllm.engine.models.gemma3 import Gemma3ForCausalLM
from libvllm.engine.models.llama import LlamaForCausalLM
from libvllm.engine.models.mixtral import MixtralForCausalLM
from libvllm.engine.models.qwen2 import Qwen2ForCausalLM
from libvllm.engine.models.qwen3 import Qwen3ForCausalLM

pytestmark = pytest.mark.skipif(ON_CUDA, reason="the interpreter on CPU")

MODELS = {"llama": LlamaForCausalLM, "qwen2": Qwen2ForCausalLM,
          "mixtral": MixtralForCausalLM, "qwen3": Qwen3ForCausalLM,
          "gemma3": Gemma3ForCausalLM}
FOLDS = {"llama": True, "qwen2": True, "mixtral": True, "qwen3": False, "gemma3": False}
BS, NQ, NKV, HD = 4, 4, 2, 16  # KV block size; the tiny models' heads


@pytest.fixture
def calls(monkeypatch) -> dict[str, list]:
    """x shapes of each fused-kernel call ("fold") and each rotary_cache call ("rope")."""
    seen: dict[str, list] = {"fold": [], "rope": []}
    spy_calls(monkeypatch, libvllm.kernels.gemv_rope_cache, "qkv_gemv_rope_cache",
              lambda x, *a, **kw: seen["fold"].append(tuple(x.shape)))
    spy_calls(monkeypatch, libvllm.kernels.rotary_cache, "rotary_embedding_and_cache",
              lambda positions, q, *a, **kw: seen["rope"].append(tuple(q.shape)))
    return seen


def _kernel_path(monkeypatch, fold: bool) -> None:
    """The attention's kernel path and the one-row GEMV on CPU; the fold on or off."""
    monkeypatch.setattr(attention, "use_kernels", lambda q: True)
    monkeypatch.setattr(linear, "_one_row_gemv", one_row_gemv_on_cpu)
    fold_switch(monkeypatch, "LIBVLLM_DISABLE_QKV_ROPE_FOLD", attention._qkv_rope_fold_enabled,
                fold)


@pytest.fixture(autouse=True)
def _fold_flag_fresh():
    attention._qkv_rope_fold_enabled.cache_clear()
    yield
    attention._qkv_rope_fold_enabled.cache_clear()


def _tiny(name: str) -> torch.nn.Module:
    cfg = ModelArchConfig(name, "t", 50, 64, 96, 2, NQ, NKV, HD, 1e-6, 1e4, 256, False,
                          architectures=(MODELS[name].__name__,),
                          attention_bias=name == "qwen2", num_experts=4 * (name == "mixtral"),
                          num_experts_per_tok=2)
    return tiny_model(MODELS[name], cfg)


def _decode_step(model, caches: list[torch.Tensor]) -> torch.Tensor:
    """[1, vocab] logits of one token at position 5 (context 0..4 in the caches)."""
    for layer, cache in zip(model.model.layers, caches):
        layer.self_attn.attn.kv_cache = cache
    with torch.inference_mode():
        hidden = model(torch.tensor([7], device=DEVICE), torch.tensor([5], device=DEVICE),
                       decode_metadata([5], BS))
        return model.compute_logits(hidden)


@pytest.mark.parametrize("name", list(MODELS))
def test_one_token_decode_with_the_fold_equals_without(name, monkeypatch, calls) -> None:
    model = _tiny(name)
    torch.manual_seed(1)
    caches0 = [torch.randn(2, 4, BS, NKV, HD, device=DEVICE) for _ in model.model.layers]
    logits, caches = {}, {}
    # Qwen3 and Gemma 3 never fold: with the fold on they take the unfused path (the call
    # counts show it), so a run with LIBVLLM_DISABLE_QKV_ROPE_FOLD=1 would repeat it
    paths = ("torch", "unfused", "folded") if FOLDS[name] else ("torch", "folded")
    for path in paths:
        if path != "torch":
            _kernel_path(monkeypatch, fold=path == "folded")
        caches[path] = [c.clone() for c in caches0]
        logits[path] = _decode_step(model, caches[path])
        layers = len(caches0)
        folded = path == "folded" and FOLDS[name]
        assert calls["fold"] == [(1, 64)] * layers * folded
        assert calls["rope"] == [(1, NQ, HD)] * layers * (path != "torch" and not folded)
        calls["fold"].clear()
        calls["rope"].clear()
    if FOLDS[name]:
        assert torch.equal(logits["folded"], logits["unfused"])
        for folded, unfused in zip(caches["folded"], caches["unfused"]):
            assert torch.equal(folded, unfused)
    for folded, plain in zip(caches["folded"], caches["torch"]):
        assert_close(folded, plain)
    assert_close(logits["folded"], logits["torch"], atol=1e-4, rtol=1e-4)


def _layer(dtype: torch.dtype = torch.float32, rotary_dim: int = HD, bias: bool = True):
    """(attention, qkv_proj, rope) of one tiny layer, its KV cache random."""
    torch.manual_seed(2)
    qkv = QKVParallelLinear(64, HD, NQ, NKV, bias=bias).to(DEVICE, dtype)
    with torch.no_grad():
        for p in qkv.parameters():
            p.normal_(0, 0.3)
    attn = Attention(NQ, HD, HD**-0.5, NKV)
    attn.kv_cache = torch.randn(2, 4, BS, NKV, HD, device=DEVICE).to(dtype)
    return attn, qkv, RotaryEmbedding(HD, rotary_dim, 64, 10000.0)


def _forward_qkv(attn, qkv, rope, x, positions, md, qk_norm=None, fold=True, monkeypatch=None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, cache) of forward_qkv on a copy of the layer's cache."""
    _kernel_path(monkeypatch, fold)
    cache0 = attn.kv_cache
    attn.kv_cache = cache0.clone()
    with torch.inference_mode():
        out = attn.forward_qkv(x, qkv, md, torch.tensor(positions, device=DEVICE), rope,
                               qk_norm)
    cache, attn.kv_cache = attn.kv_cache, cache0
    return out, cache


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("bias", [False, True])
def test_forward_qkv_folds_one_token_only(dtype, bias, monkeypatch, calls) -> None:
    attn, qkv, rope = _layer(dtype, bias=bias)
    for positions in ([5], [4, 5]):
        x = torch.randn(len(positions), 64, device=DEVICE).to(dtype)
        md = decode_metadata(positions, BS)
        folded = _forward_qkv(attn, qkv, rope, x, positions, md, monkeypatch=monkeypatch)
        if len(positions) == 2:  # never folds (the calls below): fold off, the same path
            continue
        unfused = _forward_qkv(attn, qkv, rope, x, positions, md, fold=False,
                               monkeypatch=monkeypatch)
        assert torch.equal(folded[0], unfused[0])
        assert torch.equal(folded[1], unfused[1])
    assert calls["fold"] == [(1, 64)]  # two tokens: the qkv GEMM, then rotary_cache
    assert calls["rope"] == [(1, NQ, HD), (2, NQ, HD)]


def test_forward_qkv_falls_back(monkeypatch, calls) -> None:
    """q/k norms, partial rotary, a profile run and a GGUF weight take the unfused path."""
    attn, qkv, rope = _layer()
    x, md = torch.randn(1, 64, device=DEVICE), decode_metadata([5], BS)
    norms = (RMSNorm(HD, 1e-6).to(DEVICE), RMSNorm(HD, 1e-6).to(DEVICE))
    _forward_qkv(attn, qkv, rope, x, [5], md, norms, monkeypatch=monkeypatch)
    _, _, partial = _layer(rotary_dim=HD // 2)
    _forward_qkv(attn, qkv, partial, x, [5], md, monkeypatch=monkeypatch)
    assert calls["fold"] == []
    assert len(calls["rope"]) == 2
    out, cache = _forward_qkv(attn, qkv, rope, x, [5], None, monkeypatch=monkeypatch)
    assert not out.any() and torch.equal(cache, attn.kv_cache)  # profile run: zeros
    qkv.gguf_weight = lambda x: linear.dense_linear(x, qkv.weight, None)  # a stand-in
    _forward_qkv(attn, qkv, rope, x, [5], md, monkeypatch=monkeypatch)
    assert calls["fold"] == []
