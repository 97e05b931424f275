"""config.json of the published hybrid GDN checkpoints (values of
shared/reference/hybrid-gdn.md section 1.6: Qwen3.5-27B / Qwen3.6-27B, Qwen3.5-35B-A3B /
Qwen3.6-35B-A3B as VL wrappers with text_config, Qwen3-Next-80B-A3B) read into
ModelArchConfig as vLLM's config classes read them: text_config of the VL wrapper,
layer_types from full_attention_interval, partial rotary 0.25 with the M-RoPE fields
ignored (text-only), mamba_ssm_dtype float32; and the models build on the meta device
with the parameter counts of the real checkpoints (bench shapes for load_format dummy).
"""

from __future__ import annotations

import pytest
import torch

from libvllm.engine.errors import ModelLoadError
from libvllm.engine.model_loader.hf_config import arch_config_from_hf
from libvllm.engine.models.registry import resolve_model_cls

_ROPE = {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
         "mrope_section": [11, 11, 10], "mrope_interleaved": True}
_TEXT = dict(vocab_size=248320, head_dim=256, linear_conv_kernel_dim=4, linear_key_head_dim=128,
             linear_value_head_dim=128, linear_num_key_heads=16, max_position_embeddings=262144,
             rms_norm_eps=1e-6, hidden_act="silu", attn_output_gate=True,
             full_attention_interval=4, mamba_ssm_dtype="float32", rope_parameters=_ROPE,
             tie_word_embeddings=False)
CONFIGS = {
    "Qwen3.5-27B": ({"architectures": ["Qwen3_5ForConditionalGeneration"],
                     "model_type": "qwen3_5", "vision_config": {"depth": 27},
                     "text_config": dict(_TEXT, model_type="qwen3_5_text", hidden_size=5120,
                                         num_hidden_layers=64, num_attention_heads=24,
                                         num_key_value_heads=4, intermediate_size=17408,
                                         linear_num_value_heads=48)},
                    26.5e9, 27.5e9),
    "Qwen3.5-35B-A3B": ({"architectures": ["Qwen3_5MoeForConditionalGeneration"],
                         "model_type": "qwen3_5_moe", "vision_config": {"depth": 27},
                         "text_config": dict(_TEXT, model_type="qwen3_5_moe_text",
                                             hidden_size=2048, num_hidden_layers=40,
                                             num_attention_heads=16, num_key_value_heads=2,
                                             num_experts=256, num_experts_per_tok=8,
                                             moe_intermediate_size=512,
                                             shared_expert_intermediate_size=512,
                                             linear_num_value_heads=32)},
                        34.0e9, 36.0e9),
    "Qwen3-Next-80B-A3B": ({"architectures": ["Qwen3NextForCausalLM"],
                            "model_type": "qwen3_next", **dict(
                                _TEXT, vocab_size=151936, hidden_size=2048,
                                num_hidden_layers=48, num_attention_heads=16,
                                num_key_value_heads=2, intermediate_size=5120, num_experts=512,
                                num_experts_per_tok=10, moe_intermediate_size=512,
                                shared_expert_intermediate_size=512, norm_topk_prob=True,
                                linear_num_value_heads=32, mamba_ssm_dtype=None,
                                rope_parameters={"rope_type": "default", "rope_theta": 5e6,
                                                 "partial_rotary_factor": 0.25})},
                           79.0e9, 81.5e9),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_published_configs_read_and_build(name):
    config, lo, hi = CONFIGS[name]
    cls, arch = resolve_model_cls(config["architectures"])
    cfg = arch_config_from_hf(config, arch, name)
    text = config.get("text_config", config)
    assert cfg.num_hidden_layers == text["num_hidden_layers"]
    assert cfg.layer_types.count("full_attention") == cfg.num_hidden_layers // 4
    assert cfg.layer_types[3] == "full_attention" and cfg.layer_types[0] == "linear_attention"
    assert cfg.rope_parameters["partial_rotary_factor"] == 0.25
    assert cfg.mamba_ssm_dtype == text["mamba_ssm_dtype"]
    with torch.device("meta"):
        n = sum(p.numel() for p in cls(cfg).parameters())
    assert lo < n < hi, f"{name}: {n / 1e9:.2f}B parameters"


def test_vl_wrapper_top_level_fields_are_defaults():
    config = dict(CONFIGS["Qwen3.5-27B"][0], tie_word_embeddings=True)
    config["text_config"] = {k: v for k, v in config["text_config"].items()
                             if k != "tie_word_embeddings"}
    cfg = arch_config_from_hf(config, "Qwen3_5ForConditionalGeneration", "tied")
    assert cfg.tie_word_embeddings and cfg.architecture == "qwen3_5_text"


def test_bad_gdn_head_counts_are_rejected():
    config = dict(CONFIGS["Qwen3-Next-80B-A3B"][0], linear_num_value_heads=24,
                  linear_num_key_heads=16)
    with pytest.raises(ModelLoadError, match="linear_num_value_heads=24"):
        arch_config_from_hf(config, "Qwen3NextForCausalLM", "bad")
    config = dict(CONFIGS["Qwen3-Next-80B-A3B"][0], layer_types=["mamba"] * 48)
    with pytest.raises(ModelLoadError, match="layer_types"):
        arch_config_from_hf(config, "Qwen3NextForCausalLM", "bad")
