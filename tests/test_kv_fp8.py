"""The fp8 KV cache end to end on CPU (vLLM's --kv-cache-dtype fp8 / fp8_e4m3 and
--calculate-kv-scales) and its pieces: dtype resolution, checkpoint k_scale / v_scale.

Oracle: transformers fp32 on the same weights with K and V rounded through float8_e4m3fn
in its attention (tests/kv_fp8_oracle.py, plain torch); the tiny Llama of
test_models_parity.py. Mirrors vLLM 0.33 tests/quantization/test_fp8.py (kv_cache_dtype
fp8 models load with their k/v scales, 1.0 without) and
tests/model_executor/model_loader (maybe_remap_kv_scale_name's names), and vLLM's
BaseKVCacheMethod.process_weights_after_loading rules (both scales, none, one kv_scale;
ignored with kv_cache_dtype auto).
"""

from __future__ import annotations

import logging
import math

import pytest
import torch

pytest.importorskip("transformers")
import test_models_parity as parity  # noqa: E402
from kv_fp8_oracle import fp8_round, seen_kv_max, use_fp8_kv  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from libvllm.engine.errors import InvalidArgumentError, ModelLoadError  # noqa: E402
from libvllm.engine.layers.attention import Attention  # noqa: E402
from libvllm.engine.layers.kv_cache_dtype import (  # noqa: E402
    calc_kv_scales,
    dequantize_kv,
    kv_cache_torch_dtype,
    quantize_kv,
)
from libvllm.engine.layers.kv_scales import configure_kv_cache, load_kv_scale  # noqa: E402
from libvllm.engine.model_loader import load_model  # noqa: E402
from libvllm.engine.worker.model_runner import ModelRunner  # noqa: E402

STEPS = 32
CKPT_SCALES = {0: (0.02, 0.015), 1: (0.03, 0.011)}  # k, v per layer (some v saturate)


def _attn_layers(model) -> list[Attention]:
    return [m for m in model.modules() if isinstance(m, Attention)]


def _fp8_runner(kv_cache_dtype: str = "fp8", calculate: bool = False):
    """parity.bind_kv_caches with the engine's cache dtype and k/v scales."""
    def bind(model, cfg, num_blocks, block_size):
        dtype = configure_kv_cache(model, kv_cache_dtype, calculate, torch.float32)
        kv = [torch.zeros(2, num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim,
                          dtype=dtype) for _ in range(cfg.num_hidden_layers)]
        return ModelRunner(model, kv, torch.device("cpu"), block_size)
    return bind


def save_with_scales(hf, path, scales: dict[int, tuple[float, float]]) -> None:
    """hf saved with `model.layers.{i}.self_attn.k_scale` / `v_scale` tensors added."""
    hf.save_pretrained(path)
    f = path / "model.safetensors"
    tensors = load_file(f)
    for i, (k, v) in scales.items():
        tensors[f"model.layers.{i}.self_attn.k_scale"] = torch.tensor(k)
        tensors[f"model.layers.{i}.self_attn.v_scale"] = torch.tensor(v)
    save_file(tensors, f, metadata={"format": "pt"})


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """(hf, path of the checkpoint, path of the checkpoint with k/v scales)."""
    hf = parity.make_hf_model("llama")
    path = tmp_path_factory.mktemp("llama")
    hf.save_pretrained(path)
    scaled = tmp_path_factory.mktemp("llama_scaled")
    save_with_scales(hf, scaled, CKPT_SCALES)
    return hf, str(path), str(scaled)


def test_kv_cache_dtype_resolution() -> None:
    assert kv_cache_torch_dtype("auto", torch.bfloat16) is torch.bfloat16
    assert kv_cache_torch_dtype("fp8", torch.bfloat16) is torch.float8_e4m3fn
    assert kv_cache_torch_dtype("fp8_e4m3", torch.float16) is torch.float8_e4m3fn
    with pytest.raises(InvalidArgumentError, match="Invalid kv_cache_dtype: 'fp8_e5m2'"):
        kv_cache_torch_dtype("fp8_e5m2", torch.bfloat16)


def test_engine_rule_equals_the_kernels_and_the_oracle() -> None:
    from libvllm.kernels.reshape_and_cache import dequantize_kv_ref, quantize_kv_ref

    torch.manual_seed(0)
    x = torch.randn(4096) * 40
    s = torch.tensor(0.07)
    q = quantize_kv(x, s)
    assert q.dtype == torch.float8_e4m3fn
    assert torch.equal(q.view(torch.uint8), quantize_kv_ref(x, s).view(torch.uint8))
    assert torch.equal(dequantize_kv(q, s, torch.float32), dequantize_kv_ref(q, s, torch.float32))
    assert torch.equal(dequantize_kv(q, s, torch.float32), fp8_round(x, 0.07))
    assert q.float().abs().max() == 448.0  # |x| / 0.07 past 448 saturates


def test_fp8_logits_and_greedy_tokens_match_oracle(llama, monkeypatch) -> None:
    hf, path, _ = llama
    ours, cfg, _ = load_model(path)
    monkeypatch.setattr(parity, "bind_kv_caches", _fp8_runner())
    prompts = parity.make_prompts(cfg.vocab_size)
    with torch.no_grad(), use_fp8_kv(hf):
        for ids in prompts:
            ref = hf(torch.tensor([ids])).logits[0]
            got = parity.prompt_logits(ours, cfg, ids)
            assert (got - ref).abs().max().item() < 1e-4
        got = parity.generate_greedy(ours, cfg, prompts, max_tokens=STEPS)
        for ids, tokens in zip(prompts, got):
            ref = hf.generate(torch.tensor([ids]), max_new_tokens=STEPS, do_sample=False)
            assert tokens == ref[0, len(ids):].tolist()
    assert all(layer.kv_cache.dtype == torch.float8_e4m3fn for layer in _attn_layers(ours))
    with torch.no_grad():
        unrounded = hf(torch.tensor([prompts[0]])).logits[0]
    assert (parity.prompt_logits(ours, cfg, prompts[0]) - unrounded).abs().max() > 1e-2


def test_checkpoint_scales_are_loaded_and_used(llama, monkeypatch, caplog) -> None:
    hf, _, scaled = llama
    ours, cfg, _ = load_model(scaled)
    layers = _attn_layers(ours)
    assert [tuple(layer.checkpoint_kv_scales) for layer in layers] == [
        pytest.approx(CKPT_SCALES[i]) for i in range(2)]
    monkeypatch.setattr(parity, "bind_kv_caches", _fp8_runner())
    ids = parity.make_prompts(cfg.vocab_size)[0]
    with caplog.at_level(logging.WARNING):
        got = parity.prompt_logits(ours, cfg, ids)
    assert "scaling factor 1.0" not in caplog.text
    assert [(layer.k_scale.item(), layer.v_scale.item()) for layer in layers] == [
        pytest.approx(CKPT_SCALES[i]) for i in range(2)]
    with torch.no_grad():
        with use_fp8_kv(hf, CKPT_SCALES):
            ref = hf(torch.tensor([ids])).logits[0]
        with use_fp8_kv(hf):
            ref_one = hf(torch.tensor([ids])).logits[0]
    assert (got - ref).abs().max().item() < 1e-4
    assert (got - ref_one).abs().max().item() > 1e-2  # the scales changed the result


def test_checkpoint_scales_ignored_with_auto(llama, monkeypatch, caplog) -> None:
    hf, _, scaled = llama
    ours, cfg, _ = load_model(scaled)
    monkeypatch.setattr(parity, "bind_kv_caches", _fp8_runner("auto"))
    ids = parity.make_prompts(cfg.vocab_size)[1]
    with caplog.at_level(logging.WARNING):
        got = parity.prompt_logits(ours, cfg, ids)
    assert "k_scale / v_scale are ignored: kv_cache_dtype is auto" in caplog.text
    assert all(layer.kv_cache.dtype == torch.float32 and layer.k_scale.item() == 1.0
               for layer in _attn_layers(ours))
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    assert (got - ref).abs().max().item() < 1e-4


def test_fp8_without_checkpoint_scales_warns_scale_one(llama, caplog) -> None:
    ours, _, _ = load_model(llama[1])
    with caplog.at_level(logging.WARNING):
        configure_kv_cache(ours, "fp8_e4m3", False, torch.bfloat16)
    assert "Using KV cache scaling factor 1.0 for fp8_e4m3" in caplog.text
    assert all(layer.kv_scale_values == (1.0, 1.0) for layer in _attn_layers(ours))


def test_calculate_kv_scales_from_the_first_forward(llama, monkeypatch) -> None:
    hf, _, scaled = llama  # the checkpoint's scales give way to the calculated ones
    ours, cfg, _ = load_model(scaled)
    monkeypatch.setattr(parity, "bind_kv_caches", _fp8_runner(calculate=True))
    first, second = parity.make_prompts(cfg.vocab_size)
    got = parity.prompt_logits(ours, cfg, first)
    layers = _attn_layers(ours)
    want: dict[int, tuple[float, float]] = {}
    for i in range(len(layers)):  # layer i's input depends on the scales of those before
        with torch.no_grad(), use_fp8_kv(hf, want):
            hf(torch.tensor([first]))
            want[i] = (seen_kv_max[i][0] / 200.0, seen_kv_max[i][1] / 100.0)
    assert [(layer.k_scale.item(), layer.v_scale.item()) for layer in layers] == [
        pytest.approx(want[i], rel=1e-5) for i in range(2)]
    assert not any(layer.calculate_kv_scales for layer in layers)
    with torch.no_grad(), use_fp8_kv(hf, want):
        ref = hf(torch.tensor([first])).logits[0]
    assert (got - ref).abs().max().item() < 1e-4
    # computed once: a later forward over other data keeps them
    caches = [layer.kv_cache for layer in layers]
    scales = [layer.k_scale.clone() for layer in layers]
    n = len(second)
    md = parity.AttentionMetadata(n, torch.arange(8, 8 + n), [0, n], [n],
                                  torch.arange(1, 1 + math.ceil(n / 8), dtype=torch.int32)[None])
    with torch.inference_mode():
        ours(torch.tensor(second), torch.arange(n), md)
    assert all(layer.kv_cache is c and torch.equal(layer.k_scale, s)
               for layer, c, s in zip(layers, caches, scales))


def test_calc_kv_scales_skips_padding_and_runs_once() -> None:
    k = torch.tensor([[[1.0, -4.0]], [[100.0, 0.0]], [[2.0, 0.5]]])  # [3, 1, 2]
    v = k * 0.5
    ks, vs, pending = torch.tensor(1.0), torch.tensor(1.0), torch.tensor(True)
    calc_kv_scales(k, v, torch.tensor([-1, -1, -1]), ks, vs, pending)  # a graph's padding
    assert (ks.item(), vs.item(), pending.item()) == (1.0, 1.0, True)
    calc_kv_scales(k, v, torch.tensor([4, -1, 7]), ks, vs, pending)  # row 1 is padding
    want = (torch.tensor(4.0) / 200).item(), (torch.tensor(2.0) / 100).item()  # fp32
    assert (ks.item(), vs.item(), pending.item()) == (*want, False)
    calc_kv_scales(k * 10, v, torch.tensor([4, 5, 7]), ks, vs, pending)
    assert (ks.item(), vs.item()) == want


@pytest.mark.parametrize("name,target,value", [
    ("model.layers.1.self_attn.k_scale", (1, 0), 0.5),
    ("model.layers.1.self_attn.v_proj.output_scale", (1, 1), 0.25),  # compressed-tensors
    ("model.layers.0.self_attn.k_proj.k_scale", (0, 0), 0.125),  # ModelOpt
    ("model.layers.0.self_attn.qkv_proj.v_scale", (0, 1), 2.0),
    ("model.layers.0.self_attn.attn.k_scale", (0, 0), 3.0),  # already the module's name
])
def test_scale_names_vllm_remaps(llama, name, target, value) -> None:
    ours, _, _ = load_model(llama[1])
    assert load_kv_scale(ours, name, torch.tensor([value]))
    layer, which = target
    assert _attn_layers(ours)[layer].checkpoint_kv_scales[which] == value


def test_kv_scale_duplicates_and_others_are_dropped(llama, caplog) -> None:
    ours, _, _ = load_model(llama[1])
    assert load_kv_scale(ours, "model.layers.0.self_attn.kv_scale", torch.tensor(0.5))
    assert load_kv_scale(ours, "model.layers.0.self_attn.q_scale", torch.tensor(9.0))
    assert not load_kv_scale(ours, "model.layers.0.self_attn.k_proj.weight_scale",
                             torch.tensor(1.0))
    with caplog.at_level(logging.WARNING):
        assert load_kv_scale(ours, "model.layers.0.mlp.k_scale", torch.tensor(1.0))
    assert "not found the expected name in the model" in caplog.text
    configure_kv_cache(ours, "fp8", False, torch.float32)
    assert _attn_layers(ours)[0].kv_scale_values == (0.5, 0.5)  # kv_scale -> k and v
    with pytest.raises(ModelLoadError, match="KV-cache scale expects a scalar weight"):
        load_kv_scale(ours, "model.layers.0.self_attn.k_scale", torch.ones(2))
