"""examples/bench/random_gguf_quant.py: the random speed-run GGUFs follow llama.cpp's
Q4_K_M tensor choice (src/llama-quant.cpp llama_tensor_get_type) and load in the engine."""

import subprocess
import sys
from pathlib import Path

import gguf
import pytest

from libvllm.engine.model_loader import load_gguf_model

ROOT = Path(__file__).resolve().parents[1]
Q = gguf.GGMLQuantizationType


@pytest.fixture(scope="module", params=["llama", "qwen35moe"])
def small_file(request, tmp_path_factory):
    out = tmp_path_factory.mktemp("gguf") / f"{request.param}.gguf"
    subprocess.run([sys.executable, str(ROOT / "examples/bench/random_gguf_quant.py"),
                    str(out), "q4_k_m", "--arch", request.param, "--small"], check=True)
    return request.param, out


def test_q4_k_m_tensor_types(small_file):
    arch, path = small_file
    types = {t.name: t.tensor_type for t in gguf.GGUFReader(str(path)).tensors}
    assert types["output.weight"] == Q.Q6_K and types["token_embd.weight"] == Q.Q4_K
    down = "ffn_down_exps" if arch == "qwen35moe" else "ffn_down"
    # use_more_bits(i, 8): layers 0 and 7 (first / last eighth) and 3, 6 ((i - 1) % 3 == 2)
    assert [types[f"blk.{i}.{down}.weight"] == Q.Q6_K for i in range(8)] == \
        [True, False, False, True, False, False, True, True]
    if arch == "qwen35moe":
        assert types["blk.0.ffn_gate_inp.weight"] == Q.F32  # the router is never quantized
        assert types["blk.0.ssm_conv1d.weight"] == Q.F32
        assert types["blk.0.attn_qkv.weight"] == Q.Q4_K
        assert "blk.3.attn_q.weight" in types and "blk.3.attn_qkv.weight" not in types


def test_engine_loads_it(small_file):
    arch, path = small_file
    model, cfg, reader = load_gguf_model(str(path))
    try:
        assert (cfg.architecture, cfg.num_hidden_layers) == (arch, 8)
        assert type(model).__name__ == {"llama": "LlamaForCausalLM",
                                        "qwen35moe": "Qwen3_5MoeForCausalLM"}[arch]
        if arch == "qwen35moe":
            assert cfg.num_experts == 16
    finally:
        reader.close()
