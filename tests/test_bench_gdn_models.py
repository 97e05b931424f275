"""The hybrid Gated DeltaNet bench shapes: examples/bench/models/qwen3.5-27b and
qwen3.5-35b-a3b read through the engine's config reader (engine/model_loader/hf_config.py)
as the text-only Qwen3_5(Moe)ForCausalLM, build on the meta device with the parameter
counts of the published checkpoints' language models, and the suite's batch-1 rooflines
match the bytes those models read per decode step (CPU only; no weights)."""

from __future__ import annotations

import json

import pytest
import torch

from examples.bench import suite
from libvllm.engine.model_loader.hf_config import arch_config_from_hf, read_json_object
from libvllm.engine.models.registry import resolve_model_cls

# directory: (architecture, model_type, parameters lo/hi, GDN layers, attention layers)
SHAPES = {"qwen3.5-27b": ("Qwen3_5ForCausalLM", "qwen3_5_text", 26.5e9, 27.5e9, 48, 16),
          "qwen3.5-35b-a3b": ("Qwen3_5MoeForCausalLM", "qwen3_5_moe_text", 34.0e9, 35.5e9,
                              30, 10)}


def _build(name: str):
    config = read_json_object(str(suite.MODELS / name / "config.json"))
    cls, arch = resolve_model_cls(config["architectures"])
    cfg = arch_config_from_hf(config, arch, name)
    with torch.device("meta"):
        return config, cfg, cls(cfg)


@pytest.mark.parametrize("name", list(SHAPES))
def test_config_reads_and_builds_at_published_size(name):
    arch, model_type, lo, hi, gdn, attn = SHAPES[name]
    config, cfg, model = _build(name)
    assert config["architectures"] == [arch] and cfg.architecture == model_type
    assert cfg.layer_types.count("linear_attention") == gdn
    assert cfg.layer_types.count("full_attention") == attn
    assert cfg.mamba_ssm_dtype == "float32" and cfg.attn_output_gate
    assert cfg.rope_parameters["partial_rotary_factor"] == 0.25
    n = sum(p.numel() for p in model.parameters())
    assert lo < n < hi, f"{name}: {n / 1e9:.3f}B parameters"


@pytest.mark.parametrize("name", list(SHAPES))
def test_roofline_is_the_bytes_read_per_decode_step(name):
    _, cfg, model = _build(name)
    read = 0
    for pname, p in model.named_parameters():
        if "embed_tokens" in pname:
            continue  # a gather of one row, not a read of the table
        share = cfg.num_experts_per_tok / cfg.num_experts if ".experts.w" in pname else 1
        read += p.numel() * share * 2  # bf16
    assert suite.STEP_BYTES[name] == pytest.approx(read, rel=1e-6)


def test_suite_has_the_gdn_steps_opt_in():
    for name in SHAPES:
        model, extra, batches = suite.STEPS[name]
        assert model == name and batches == [1]
        assert extra == (["--max-num-seqs", "128"] if name == "qwen3.5-27b" else [])
        assert name in suite.RANDOM_THROUGHPUT_STEPS and name not in suite.DEFAULT_STEPS
        assert 0 < suite.TARGETS[name] < 1 and suite.VLLM_PUBLISHED[name]
    assert set(suite.DEFAULT_STEPS) <= set(suite.STEPS)


def test_table_rows_for_the_gdn_steps():
    res = {"qwen3.5-27b": {"latency_b1": {"decode_tokens_per_second": 67.0},
                           "throughput": {"num_requests": 1000, "requests_per_second": 5.0,
                                          "output_tokens_per_second": 640.0}}}
    table = suite.table(res, {"qwen3.5-35b-a3b": "PENDING: suite time budget spent"})
    assert "Qwen3.5-27B b1 decode" in table and "80% of 84 roofline" in table
    assert "b1 100% of it (MI300X)" in table and "5.00 req/s" in table
    assert "Qwen3.5-35B-A3B b1 decode" in table and "PENDING: suite time budget" in table
    assert "Qwen3.5" not in suite.table({}, {})  # the default suite's table is unchanged


def test_gdn_step_runs_latency_and_throughput_on_tiny_shapes(tmp_path, monkeypatch):
    """The step's plumbing on CPU: a tiny Qwen3.5-MoE config under the step's directory."""
    config = read_json_object(str(suite.MODELS / "qwen3.5-35b-a3b" / "config.json"))
    config.update(hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
                  linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
                  num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                  shared_expert_intermediate_size=32, vocab_size=10240,
                  layer_types=config["layer_types"][:4])
    (tmp_path / "qwen3.5-35b-a3b").mkdir()
    (tmp_path / "qwen3.5-35b-a3b" / "config.json").write_text(json.dumps(config))
    monkeypatch.setattr(suite, "MODELS", tmp_path)
    monkeypatch.setattr(suite, "COMMON", [*suite.COMMON, "--device", "cpu", "--dtype", "float32"])
    monkeypatch.setattr(suite, "LAT", ["--input-len", "8", "--output-len", "4",
                                       "--num-iters-warmup", "0", "--num-iters", "1"])
    monkeypatch.setattr(suite, "THROUGHPUT_LENS", (24, 4))
    suite.run_step("qwen3.5-35b-a3b", tmp_path, throughput_prompts=3)
    res = json.loads((tmp_path / "suite-qwen3.5-35b-a3b.json").read_text())
    assert res["latency_b1"]["decode_tokens_per_second"] > 0
    assert res["throughput"]["num_requests"] == 3
    assert res["throughput"]["total_prompt_tokens"] == 3 * 24
    assert "throughput_sharegpt" not in res
