"""GGUF mixture-of-experts checkpoints (Qwen3-MoE, Mixtral) in llama.cpp's layout load to the
same model as their safetensors twins and to transformers' logits.

Each tiny random transformers model (test_models_parity.make_hf_model) is saved with
save_pretrained (the safetensors twin) and written as a GGUF file the way llama.cpp's
convert_hf_to_gguf.py writes MoE models: `{arch}.expert_count` / `expert_used_count` /
`expert_feed_forward_length`, the router as `ffn_gate_inp`, every layer's experts stacked as
`ffn_gate_exps` / `ffn_up_exps` [E, I, H] and `ffn_down_exps` [E, H, I]; Mixtral is arch
"llama" with Q/K permuted. Checks: the config read from the metadata, every parameter
equal to the safetensors twin's (F32 file) or to the gguf package's dequantization (Q8_0
experts), prompt logits within 1e-4 of transformers. On CUDA (gpu): the GGUF model in bf16
with its experts kept quantized against the CPU model (the CPU side of that load is
tests/test_kernels_moe_gguf.py, under the Triton interpreter).
Mirrors vLLM 0.33 tests/models/quantization/test_gguf.py (GGUF vs HF outputs) with tiny
random MoE configs in place of hub checkpoints.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
pytest.importorskip("transformers")

from test_models_parity import _permute, make_hf_model, make_prompts, prompt_logits  # noqa: E402

from libvllm.engine.model_loader import load_model  # noqa: E402

Q = gguf.GGMLQuantizationType
ARCH = {"qwen3_moe": "qwen3moe", "mixtral": "llama"}


def _meta(w, c, arch: str) -> None:
    hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    experts = getattr(c, "num_experts", None) or c.num_local_experts
    w.add_expert_count(experts)
    w.add_expert_used_count(c.num_experts_per_tok)
    if arch == "qwen3moe":
        w.add_expert_feed_forward_length(c.moe_intermediate_size)


def write_moe_gguf(hf, path, expert_type=None) -> dict[str, np.ndarray]:
    """The HF model as llama.cpp's GGUF; returns each expert tensor as the file holds it
    (dequantized when expert_type is set)."""
    c, arch = hf.config, ARCH[hf.config.model_type]
    w = gguf.GGUFWriter(str(path), arch=arch)
    _meta(w, c, arch)
    names = gguf.get_tensor_name_map(
        next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch), c.num_hidden_layers)
    dense_ffn = {"mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                 "mlp.down_proj": "ffn_down"}
    stored = {}

    def add(name: str, a: np.ndarray, qtype=None) -> None:
        a = np.ascontiguousarray(a, dtype=np.float32)
        if qtype is None:
            w.add_tensor(name, a)
            stored[name] = a
        else:
            raw = gguf.quants.quantize(a, qtype)
            w.add_tensor(name, raw, raw_dtype=qtype)
            stored[name] = gguf.quants.dequantize(raw, qtype)

    for hf_name, t in hf.state_dict().items():
        a = t.numpy().astype(np.float32)
        if hf_name.endswith("experts.gate_up_proj"):  # [E, 2I, H]: gate rows, then up rows
            blk = f"blk.{hf_name.split('.')[2]}"
            half = a.shape[1] // 2
            add(f"{blk}.ffn_gate_exps.weight", a[:, :half], expert_type)
            add(f"{blk}.ffn_up_exps.weight", a[:, half:], expert_type)
            continue
        if hf_name.endswith("experts.down_proj"):  # [E, H, I]
            add(f"blk.{hf_name.split('.')[2]}.ffn_down_exps.weight", a, expert_type)
            continue
        base, kind = hf_name.rsplit(".", 1)
        part = next((v for k, v in dense_ffn.items() if base.endswith(k)), None)
        if part is not None:  # a dense layer (mlp_only_layers): llama.cpp's dense names
            w.add_tensor(f"blk.{base.split('.')[2]}.{part}.{kind}", a)
            continue
        if arch == "llama" and base.endswith("q_proj"):
            a = _permute(a, c.num_attention_heads)
        elif arch == "llama" and base.endswith("k_proj"):
            a = _permute(a, c.num_key_value_heads)
        w.add_tensor(f"{names.get_name(base)}.{kind}", a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return stored


CASES = {"qwen3_moe": dict(mlp_only_layers=[]), "qwen3_moe_dense_layer": dict(),
         "mixtral": dict()}


def _hf(case: str):
    return make_hf_model(case.removesuffix("_dense_layer"), **CASES[case])


@pytest.mark.parametrize("case", list(CASES))
def test_gguf_moe_matches_its_safetensors_twin_and_transformers(case, tmp_path) -> None:
    hf = _hf(case)
    hf.save_pretrained(tmp_path / "st")
    write_moe_gguf(hf, tmp_path / "m.gguf")
    ours, cfg, reader = load_model(str(tmp_path / "m.gguf"))
    reader.close()
    twin, twin_cfg, _ = load_model(str(tmp_path / "st"))
    assert cfg.architectures == twin_cfg.architectures
    for field in ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
                  "norm_topk_prob", "mlp_only_layers", "intermediate_size"):
        assert getattr(cfg, field) == getattr(twin_cfg, field), field
    twin_params = dict(twin.named_parameters())
    for name, p in ours.named_parameters():
        assert torch.equal(p, twin_params[name]), name
    for ids in make_prompts(cfg.vocab_size):
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0]
        assert (prompt_logits(ours, cfg, ids) - ref).abs().max().item() < 1e-4


@pytest.mark.parametrize("case", ["qwen3_moe", "mixtral"])
def test_quantized_experts_load_as_the_file_dequantizes(case, tmp_path) -> None:
    hf = _hf(case)
    stored = write_moe_gguf(hf, tmp_path / "q8.gguf", expert_type=Q.Q8_0)
    ours, cfg, reader = load_model(str(tmp_path / "q8.gguf"))
    reader.close()
    i = cfg.moe_intermediate_size or cfg.intermediate_size
    for layer in range(cfg.num_hidden_layers):
        experts = ours.model.layers[layer].mlp.experts
        blk = f"blk.{layer}"
        assert torch.equal(experts.w13_weight[:, :i],
                           torch.from_numpy(stored[f"{blk}.ffn_gate_exps.weight"]))
        assert torch.equal(experts.w13_weight[:, i:],
                           torch.from_numpy(stored[f"{blk}.ffn_up_exps.weight"]))
        assert torch.equal(experts.w2_weight,
                           torch.from_numpy(stored[f"{blk}.ffn_down_exps.weight"]))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case", ["qwen3_moe", "mixtral"])
def test_gguf_moe_on_cuda_matches_the_cpu_model(case, tmp_path) -> None:
    """Loaded for CUDA (Q8_0 experts kept as GGUF blocks: kernels/moe_gguf.py for few
    tokens, dequantized + Triton fused MoE for many) against the fp32 CPU model's MoE
    block: bf16 tolerance."""
    hf = _hf(case)
    write_moe_gguf(hf, tmp_path / "q8.gguf", expert_type=Q.Q8_0)
    cpu, cfg, reader = load_model(str(tmp_path / "q8.gguf"))
    reader.close()
    dev = torch.device("cuda")
    gpu, _, reader = load_model(str(tmp_path / "q8.gguf"), device=dev)
    reader.close()
    gpu = gpu.to(dev, torch.bfloat16)
    assert gpu.model.layers[0].mlp.experts.gguf_experts is not None
    for n in (1, 5, 40):
        h = torch.randn(n, cfg.hidden_size, device=dev, dtype=torch.bfloat16)
        with torch.inference_mode():
            got = gpu.model.layers[0].mlp(h)
            want = cpu.model.layers[0].mlp(h.float().cpu())
        assert ((got.float().cpu() - want).abs().max() / want.abs().max()) < 3e-2
