"""GGUF files of llama.cpp's qwen3next / qwen35 / qwen35moe layouts (engine/model_loader/
gguf_hybrid.py) load and match their safetensors twins (transformers fp32 prompt logits
within 1e-4).

The files are written here with the gguf package the way llama.cpp's conversion/qwen.py
does (Qwen3NextModel, Qwen3_5TextModel, Qwen3_5MoeTextModel): zero-centred norms as w + 1
(not ssm_norm), ssm_a = -exp(A_log) without a suffix, ssm_dt.bias, ssm_conv1d [C, K],
Qwen3-Next in-projections de-interleaved into attn_qkv + attn_gate (or the legacy raw
ssm_in), ssm_ba raw, Qwen3.5 value heads reordered grouped -> tiled, stacked experts, an
MTP block appended (block_count includes it, nextn_predict_layers says so).
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from test_models_hybrid_gdn import OneRequest, make_hf_model

from libvllm.engine.model_loader import load_model
from libvllm.engine.model_loader.gguf_hybrid import untile_heads

pytest.importorskip("transformers")

_NAMES = {  # HF suffix under model.layers.N -> GGUF part
    "input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "linear_attn.in_proj_qkv": "attn_qkv",
    "linear_attn.in_proj_z": "attn_gate", "linear_attn.in_proj_b": "ssm_beta",
    "linear_attn.in_proj_a": "ssm_alpha", "linear_attn.in_proj_ba": "ssm_ba",
    "linear_attn.conv1d": "ssm_conv1d", "linear_attn.norm": "ssm_norm",
    "linear_attn.out_proj": "ssm_out", "mlp.gate": "ffn_gate_inp",
    "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
    "mlp.shared_expert.gate_proj": "ffn_gate_shexp", "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def _tile(w: torch.Tensor, hk: int, hv: int, dim: int = 0) -> torch.Tensor:
    # llama.cpp's _reorder_v_heads: grouped (head g * r + i) -> tiled (head i * hk + g)
    w = w.movedim(dim, 0)
    r, d = hv // hk, w.shape[0] // hv
    return w.reshape(hk, r, d, *w.shape[1:]).transpose(0, 1).reshape(w.shape).movedim(0, dim)


def _split_qkvz(w: torch.Tensor, c) -> tuple[torch.Tensor, torch.Tensor]:
    # Qwen3NextModel: per key-head group [q, k, v, z] rows -> cat(Q, K, V), Z
    hk, r = c.linear_num_key_heads, c.linear_num_value_heads // c.linear_num_key_heads
    dk, dv = c.linear_key_head_dim, c.linear_value_head_dim
    q, k, v, z = w.view(hk, -1, w.shape[1]).split([dk, dk, r * dv, r * dv], dim=1)
    return torch.cat([x.reshape(-1, w.shape[1]) for x in (q, k, v)]), z.reshape(-1, w.shape[1])


def _layer_tensors(name: str, t: torch.Tensor, arch: str, c, legacy: bool):
    """(GGUF part, tensor) pairs for one HF tensor of a layer."""
    hk, hv = c.linear_num_key_heads, c.linear_num_value_heads
    key_dim = 2 * hk * c.linear_key_head_dim
    tiled = arch != "qwen3next"
    if name == "linear_attn.in_proj_qkvz.weight":
        if legacy:
            return [("ssm_in.weight", t)]
        qkv, z = _split_qkvz(t, c)
        return [("attn_qkv.weight", qkv), ("attn_gate.weight", z)]
    if name == "linear_attn.A_log":
        return [("ssm_a", _tile(-t.exp(), hk, hv) if tiled else -t.exp())]
    if name == "linear_attn.dt_bias":
        return [("ssm_dt.bias", _tile(t, hk, hv) if tiled else t)]
    if ".experts." in name:  # written stacked by write_gguf
        return []
    base, kind = name.rsplit(".", 1)
    part = _NAMES[base]
    if base.endswith("norm") and base != "linear_attn.norm":
        t = t + 1
    if part == "ssm_conv1d":
        t = t[:, 0]
    if part == "ffn_gate_inp_shexp":
        t = t[0]
    if tiled and part in ("attn_qkv", "ssm_conv1d"):
        t = torch.cat([t[:key_dim], _tile(t[key_dim:], hk, hv)])
    elif tiled and part in ("attn_gate", "ssm_beta", "ssm_alpha"):
        t = _tile(t, hk, hv)
    elif tiled and part == "ssm_out":
        t = _tile(t, hk, hv, dim=1)
    return [(f"{part}.{kind}", t)]


def write_gguf(hf, arch: str, path, legacy: bool = False) -> None:
    c = hf.config
    w = gguf.GGUFWriter(str(path), arch=arch)
    a = arch + "."
    mtp = 1 if arch != "qwen3next" else 0
    for key, v in [("block_count", c.num_hidden_layers + mtp), ("context_length", 512),
                   ("embedding_length", c.hidden_size),
                   ("feed_forward_length", getattr(c, "intermediate_size", 0) or 0),
                   ("attention.head_count", c.num_attention_heads),
                   ("attention.head_count_kv", c.num_key_value_heads),
                   ("attention.key_length", c.head_dim), ("attention.value_length", c.head_dim),
                   ("rope.dimension_count", int(c.head_dim * 0.25)),
                   ("ssm.conv_kernel", c.linear_conv_kernel_dim),
                   ("ssm.state_size", c.linear_key_head_dim),
                   ("ssm.group_count", c.linear_num_key_heads),
                   ("ssm.time_step_rank", c.linear_num_value_heads),
                   ("ssm.inner_size", c.linear_num_value_heads * c.linear_value_head_dim),
                   ("full_attention_interval", 4), ("nextn_predict_layers", mtp)]:
        w.add_uint32(a + key, v)
    w.add_float32(a + "attention.layer_norm_rms_epsilon", c.rms_norm_eps)
    w.add_float32(a + "rope.freq_base", c.rope_parameters["rope_theta"])
    if getattr(c, "num_experts", 0):
        for key, v in [("expert_count", c.num_experts), ("expert_used_count",
                       c.num_experts_per_tok), ("expert_feed_forward_length",
                       c.moe_intermediate_size), ("expert_shared_feed_forward_length",
                       c.shared_expert_intermediate_size)]:
            w.add_uint32(a + key, v)
    sd = hf.state_dict()
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"].numpy())
    w.add_tensor("output_norm.weight", (sd["model.norm.weight"] + 1).numpy())
    w.add_tensor("output.weight", sd["lm_head.weight"].numpy())
    for i in range(c.num_hidden_layers):
        pre = f"model.layers.{i}."
        for name, t in sd.items():
            if name.startswith(pre):
                for part, x in _layer_tensors(name[len(pre):], t, arch, c, legacy):
                    w.add_tensor(f"blk.{i}.{part}", x.contiguous().numpy().astype(np.float32))
        if getattr(c, "num_experts", 0):  # in memory: fused [E, 2I, H] and [E, H, I]
            gate, up = sd[f"{pre}mlp.experts.gate_up_proj"].chunk(2, dim=1)
            for kind, t in (("gate", gate), ("up", up),
                            ("down", sd[f"{pre}mlp.experts.down_proj"])):
                w.add_tensor(f"blk.{i}.ffn_{kind}_exps.weight", t.contiguous().numpy())
    if mtp:  # an MTP block: skipped by the loader
        w.add_tensor(f"blk.{c.num_hidden_layers}.nextn.eh_proj.weight",
                     np.zeros((4, 4), dtype=np.float32))
        w.add_tensor(f"blk.{c.num_hidden_layers}.attn_norm.weight",
                     np.ones(c.hidden_size, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("family,arch,legacy", [
    ("qwen3_next", "qwen3next", False), ("qwen3_next", "qwen3next", True),
    ("qwen3_5", "qwen35", False), ("qwen3_5_moe", "qwen35moe", False)])
def test_gguf_twin_matches_transformers(family, arch, legacy, tmp_path):
    hf = make_hf_model(family, linear_value_head_dim=16)  # llama.cpp: dk = dv
    write_gguf(hf, arch, tmp_path / "twin.gguf", legacy)
    ours, cfg, reader = load_model(str(tmp_path / "twin.gguf"))
    reader.close()
    assert cfg.architecture == arch and cfg.num_hidden_layers == hf.config.num_hidden_layers
    assert cfg.rope_parameters["partial_rotary_factor"] == 0.25
    ids = torch.randint(0, cfg.vocab_size, (19,), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    got = OneRequest(ours, cfg, 32).forward(ids.tolist())
    assert (got - ref).abs().max().item() < 1e-4


def test_untile_inverts_llama_cpp_reorder():
    w = torch.arange(2 * 6 * 3 * 5, dtype=torch.float32).reshape(2 * 6 * 3, 5)  # hv=6, d=3
    assert torch.equal(untile_heads(_tile(w, 2, 6), 2, 6), w)
    assert torch.equal(untile_heads(_tile(w.t(), 2, 6, dim=1), 2, 6, dim=1), w.t())
    tiled = _tile(torch.arange(6.0), 2, 6)  # value head p of the file uses key head p % 2
    assert tiled.tolist() == [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
