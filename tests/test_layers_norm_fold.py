"""The RMSNorm fold of batch-1 decode (engine/layers/linear.py forward_rms_norm ->
kernels/gemv.py rms_norm_gemv) wired through the decoder layers of Llama, Qwen2 (qkv bias),
Gemma 3 (GemmaRMSNorm, offset 1) and Mixtral (MoE: its post-attention norm stays a norm).

Off CUDA the layers never fold (the CPU path is the torch one, bit for bit); these tests
let the one-row GEMV dispatch accept CPU tensors so that the kernels run under the Triton
interpreter, and check a one-token forward with the fold equals the same forward with
LIBVLLM_DISABLE_NORM_FOLD=1 and the plain CPU path, with the fold taken twice per
layer. On CUDA (marked gpu): the fold is taken for one bf16 row and not for two.
No upstream test: vLLM has no such fusion.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_kernels_common import DEVICE, ON_CUDA, assert_close, gpu

import engine.layers.linear as linear
import kernels.gemv
from engine.layers.attention import Attention
from engine.layers.layernorm import GemmaRMSNorm, RMSNorm
from engine.layers.linear import ReplicatedLinear
from engine.models.config import ModelArchConfig
from engine.models.gemma3 import Gemma3ForCausalLM
from engine.models.llama import LlamaForCausalLM
from engine.models.mixtral import MixtralForCausalLM
from engine.models.qwen2 import Qwen2ForCausalLM

MODELS = {"llama": LlamaForCausalLM, "qwen2": Qwen2ForCausalLM, "gemma3": Gemma3ForCausalLM,
          "mixtral": MixtralForCausalLM}
FOLDS_PER_LAYER = {"llama": 2, "qwen2": 2, "gemma3": 2, "mixtral": 1}


@pytest.fixture
def fold_calls(monkeypatch) -> list[tuple]:
    """(x shape, has residual, weight offset) of each rms_norm_gemv call."""
    calls: list[tuple] = []
    real = kernels.gemv.rms_norm_gemv

    def spy(x, w, bias, norm_weight, eps, weight_offset=0.0, residual=None):
        calls.append((tuple(x.shape), residual is not None, weight_offset))
        return real(x, w, bias, norm_weight, eps, weight_offset, residual)

    monkeypatch.setattr(kernels.gemv, "rms_norm_gemv", spy)
    return calls


def _cpu_gemv_dispatch(monkeypatch) -> None:
    """Let the one-row GEMV dispatch take CPU tensors (the interpreter runs the kernels)."""
    monkeypatch.setattr(linear, "_one_row_gemv", lambda x, w, b: (
        x.dim() == 2 and x.shape[0] == 1 and x.stride(1) == 1 and w.dtype == x.dtype
        and w.is_contiguous()))


def _fold_disabled(monkeypatch, disabled: bool) -> None:
    if disabled:
        monkeypatch.setenv("LIBVLLM_DISABLE_NORM_FOLD", "1")
    else:
        monkeypatch.delenv("LIBVLLM_DISABLE_NORM_FOLD", raising=False)
    linear._norm_fold_enabled.cache_clear()


def _tiny(name: str) -> torch.nn.Module:
    cfg = ModelArchConfig(name, "t", 50, 64, 96, 2, 4, 2, 16, 1e-6, 1e4, 256, False,
                          architectures=(MODELS[name].__name__,),
                          attention_bias=name == "qwen2", num_experts=4 * (name == "mixtral"),
                          num_experts_per_tok=2)
    torch.manual_seed(0)
    model = MODELS[name](cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2) if p.dim() > 1 else p.uniform_(0.5, 1.5)
    return model.eval()


def _forward_one_token(model) -> torch.Tensor:
    """[1, vocab] logits of one token; the attention returns its q (no KV cache needed)."""
    with torch.inference_mode():
        hidden = model(torch.tensor([7]), torch.tensor([3]), None)
        return model.compute_logits(hidden)


@pytest.mark.skipif(ON_CUDA, reason="the interpreter on CPU")
@pytest.mark.parametrize("name", list(MODELS))
def test_one_token_forward_with_the_fold_equals_without(name, monkeypatch, fold_calls) -> None:
    monkeypatch.setattr(Attention, "forward", lambda self, q, k, v, md, *a: q + k.sum())
    model = _tiny(name)
    plain = _forward_one_token(model)  # the CPU path: no kernels
    assert fold_calls == []
    _cpu_gemv_dispatch(monkeypatch)
    _fold_disabled(monkeypatch, True)
    unfolded = _forward_one_token(model)
    assert fold_calls == []
    _fold_disabled(monkeypatch, False)
    folded = _forward_one_token(model)
    _fold_disabled(monkeypatch, False)
    layers = model.config.num_hidden_layers
    assert len(fold_calls) == FOLDS_PER_LAYER[name] * layers
    # the first layer's input norm has no residual; GemmaRMSNorm scales by 1 + w
    offset = 1.0 if name == "gemma3" else 0.0
    assert fold_calls[0] == ((1, 64), False, offset)
    assert all(call == ((1, 64), True, offset) for call in fold_calls[1:])
    assert_close(folded, unfolded)
    assert_close(folded, plain)


@pytest.mark.skipif(ON_CUDA, reason="the interpreter on CPU")
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("norm_cls", [RMSNorm, GemmaRMSNorm])
def test_forward_rms_norm_folds_one_row_only(residual, norm_cls, monkeypatch, fold_calls
                                             ) -> None:
    """One row folds; two rows run the norm (in place, as the kernel path does) then the
    projection; the results equal norm + linear and the residual is x + residual."""
    torch.manual_seed(1)
    lin = ReplicatedLinear(40, 24, bias=True)
    lin.weight.data.normal_()
    lin.bias.data.normal_()
    norm = norm_cls(40)
    norm.weight.data.uniform_(0.5, 1.5)
    _cpu_gemv_dispatch(monkeypatch)
    for rows in (1, 2):
        x, res = torch.randn(rows, 40), torch.randn(rows, 40) if residual else None
        if residual:
            want_x, want_res = norm.forward_native(x, res)
        else:
            want_x, want_res = norm.forward_native(x), x
        y, new_res = lin.forward_rms_norm(x.clone(), None if res is None else res.clone(), norm)
        assert_close(y, F.linear(want_x, lin.weight, lin.bias))
        torch.testing.assert_close(new_res, want_res, rtol=0, atol=0)
    assert fold_calls == [((1, 40), residual, norm_cls.weight_offset)]


@gpu
def test_forward_rms_norm_takes_the_kernel_for_one_bf16_row(fold_calls) -> None:
    torch.manual_seed(2)
    lin = ReplicatedLinear(4096, 6144, bias=True).to(DEVICE, torch.bfloat16)
    lin.weight.data.normal_(std=4096**-0.5)
    lin.bias.data.normal_()
    norm = RMSNorm(4096).to(DEVICE, torch.bfloat16)
    norm.weight.data.uniform_(0.5, 1.5)
    for rows in (1, 2):
        x = torch.randn(rows, 4096, dtype=torch.bfloat16, device=DEVICE)
        res = torch.randn(rows, 4096, dtype=torch.bfloat16, device=DEVICE)
        want_x, want_res = norm.forward_native(x, res)
        y, new_res = lin.forward_rms_norm(x.clone(), res.clone(), norm)
        assert_close(y, F.linear(want_x, lin.weight, lin.bias))
        torch.testing.assert_close(new_res, want_res, rtol=0, atol=0)
    assert fold_calls == [((1, 4096), True, 0.0)]  # two rows: the norm kernel + cuBLAS


@gpu
def test_fold_off_with_the_env_var(fold_calls, monkeypatch) -> None:
    lin = ReplicatedLinear(64, 32).to(DEVICE, torch.bfloat16)
    norm = RMSNorm(64).to(DEVICE, torch.bfloat16)
    x = torch.randn(1, 64, dtype=torch.bfloat16, device=DEVICE)
    _fold_disabled(monkeypatch, True)
    lin.forward_rms_norm(x, None, norm)
    _fold_disabled(monkeypatch, False)
    assert fold_calls == []
