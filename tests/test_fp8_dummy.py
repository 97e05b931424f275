"""--load-format dummy with a quantization_config: random weights in the real FP8 layout.

Mirrors vLLM 0.33 vllm/model_executor/model_loader/dummy_loader.py on a quantized config
(the layers' quant methods create the fp8 parameters, then the dummy fill), and checks the
bench suite's FP8 model folders (examples/bench/models/*-fp8): their config resolves to
block FP8 and every layer of the real shapes passes vLLM's block-shape checks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from libvllm.engine.layers.quantization import apply_quant_config
from libvllm.engine.model_loader import load_model
from libvllm.engine.model_loader.dummy_loader import initialize_dummy_weights
from libvllm.engine.model_loader.safetensors_loader import read_hf_arch
from tests.test_models_parity import make_hf_model, prompt_logits

pytest.importorskip("transformers")

MODELS = Path(__file__).resolve().parents[1] / "examples" / "bench" / "models"
BLOCK = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
         "weight_block_size": [32, 32], "modules_to_not_convert": ["lm_head"]}


@pytest.fixture
def tiny_dir(tmp_path):
    make_hf_model("qwen3_moe").save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "quantization_config": BLOCK}))
    return tmp_path


def test_dummy_fill_keeps_the_fp8_layout(tiny_dir):
    cls, cfg, qcfg = read_hf_arch(str(tiny_dir))
    model = cls(cfg)
    apply_quant_config(model, qcfg)
    initialize_dummy_weights(model)
    qkv = model.model.layers[0].self_attn.qkv_proj
    experts = model.model.layers[0].mlp.experts
    assert qkv.weight.dtype == experts.w13_weight.dtype == torch.float8_e4m3fn
    assert qkv.weight.float().abs().max() > 0.5  # U[-1, 1), not the dense dummy's 1e-3
    for scale in (qkv.weight_scale_inv, experts.w13_weight_scale_inv,
                  experts.w2_weight_scale_inv):
        assert scale.dtype == torch.float32 and scale.min() >= 1e-3 and scale.max() < 2e-3


def test_dummy_fp8_model_runs_on_cpu(tiny_dir):
    model, cfg, _ = load_model(str(tiny_dir), load_format="dummy")
    w = model.model.layers[0].self_attn.qkv_proj.weight  # dequantized at load on the CPU
    assert w.dtype == torch.float32 and 0 < w.abs().max() < 2e-3
    assert torch.isfinite(prompt_logits(model, cfg, list(range(10)))).all()


def test_dummy_online_fp8(tmp_path):
    make_hf_model("llama").save_pretrained(tmp_path)
    model, cfg, _ = load_model(str(tmp_path), load_format="dummy", quantization="fp8")
    w = model.model.layers[0].mlp.down_proj.weight
    scale = w.abs().max() / 448.0  # per-tensor: every value is an fp8 value times it
    assert torch.equal((w / scale).to(torch.float8_e4m3fn).float() * scale, w)


@pytest.mark.parametrize("folder, fp8_params", [("llama-3.1-8b-fp8", 6_979_321_856),
                                                ("qwen3.5-35b-a3b-fp8", 32_862_371_840)])
def test_bench_fp8_folders_validate(folder, fp8_params):
    cls, cfg, qcfg = read_hf_arch(str(MODELS / folder))
    assert qcfg.name == "fp8" and qcfg.scheme.block == (128, 128)
    with torch.device("meta"):
        model = cls(cfg)
        apply_quant_config(model, qcfg)
    n = sum(p.numel() for p in model.parameters() if p.dtype == torch.float8_e4m3fn)
    assert n == fp8_params  # every linear weight but the LM head (and GDN in_proj, routers)
