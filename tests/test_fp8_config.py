"""Quantization configs as vLLM 0.33 reads them (no model): the checkpoint's method and
its agreement with `quantization`, Fp8Config / CompressedTensorsConfig schemes, and the
ignored-module matching of vllm/model_executor/layers/quantization/utils/quant_utils.py
is_layer_skipped (fused shards, a VL checkpoint's `model.language_model.` names,
compressed-tensors' `re:` patterns). Ports the config cases of tests/quantization/
test_fp8.py and test_compressed_tensors.py.
"""

from __future__ import annotations

import pytest

from libvllm.engine.errors import ModelLoadError
from libvllm.engine.layers.quantization import checkpoint_quant_method, get_quant_config
from libvllm.engine.layers.quantization.compressed_tensors import CompressedTensorsConfig
from libvllm.engine.layers.quantization.fp8 import Fp8Config, Fp8OnlineConfig

QWEN_FP8 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
            "weight_block_size": [128, 128],
            "modules_to_not_convert": ["lm_head", "model.language_model.layers.0.mlp.gate",
                                       "model.language_model.layers.1.self_attn.q_proj",
                                       "model.language_model.layers.1.self_attn.k_proj",
                                       "model.language_model.layers.1.self_attn.v_proj"]}


def test_qwen_block_fp8_config():
    cfg = get_quant_config({"quantization_config": QWEN_FP8}, None)
    assert isinstance(cfg, Fp8Config)
    assert (cfg.scheme.kind, cfg.scheme.block, cfg.scheme.scale_name) == \
        ("block", (128, 128), "weight_scale_inv")
    assert cfg.is_ignored("model.layers.0.mlp.gate")  # the VL prefix maps to the text model
    shards = ["q_proj", "k_proj", "v_proj"]
    assert cfg.is_layer_skipped("model.layers.1.self_attn.qkv_proj", shards)
    assert not cfg.is_layer_skipped("model.layers.0.self_attn.qkv_proj", shards)


def test_ignored_layers_wins_over_modules_to_not_convert():
    cfg = Fp8Config.from_config({**QWEN_FP8, "ignored_layers": ["lm_head.x"]})
    assert cfg.ignored == ["lm_head.x"]


def test_fp8_without_block_is_per_tensor():
    dyn = Fp8Config.from_config({"quant_method": "fp8", "activation_scheme": "dynamic"})
    static = Fp8Config.from_config({"quant_method": "fp8", "activation_scheme": "static"})
    assert (dyn.scheme.kind, dyn.scheme.static_input) == ("tensor", False)
    assert (static.scheme.kind, static.scheme.static_input) == ("tensor", True)
    with pytest.raises(ModelLoadError, match=r"Cannot find any of \['activation_scheme'\]"):
        Fp8Config.from_config({"quant_method": "fp8"})


def test_method_resolution():
    assert checkpoint_quant_method({}, None) is None
    assert get_quant_config({}, None) is None
    assert isinstance(get_quant_config({}, "fp8"), Fp8OnlineConfig)  # fp8_per_tensor online
    vl = {"text_config": {"quantization_config": QWEN_FP8}}
    assert checkpoint_quant_method(vl, None) == "fp8"
    assert checkpoint_quant_method({"quantization_config": {"quant_method": "FP8"}}, "fp8") == \
        "fp8"  # vLLM lower-cases the checkpoint's name
    with pytest.raises(ModelLoadError, match="quant_method"):
        checkpoint_quant_method({"quantization_config": [1]}, None)


def test_compressed_tensors_ignore_patterns():
    cfg = CompressedTensorsConfig.from_config({
        "quant_method": "compressed-tensors", "ignore": ["lm_head", "re:.*mlp.gate$"],
        "config_groups": {"g": {"targets": ["Linear"], "weights": {
            "num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel"},
            "input_activations": {"num_bits": 8, "type": "float", "dynamic": True,
                                  "strategy": "token"}}}})
    assert (cfg.scheme.kind, cfg.scheme.scale_name) == ("channel", "weight_scale")
    assert cfg.is_ignored("model.layers.3.mlp.gate") and cfg.is_ignored("lm_head")
    assert not cfg.is_ignored("model.layers.3.mlp.gate_proj")


@pytest.mark.parametrize("config, match", [
    ({"config_groups": {}}, "needs config_groups"),
    ({"config_groups": {"a": {}, "b": {}}}, "only one config group"),
    ({"config_groups": {"a": {"targets": ["Attention"]}}}, "targets"),
    ({"format": "pack-quantized", "config_groups": {"a": {"targets": ["Linear"]}}},
     "No compressed-tensors compatible scheme"),
])
def test_bad_compressed_tensors_configs(config, match):
    with pytest.raises(ModelLoadError, match=match):
        CompressedTensorsConfig.from_config({"quant_method": "compressed-tensors", **config})
