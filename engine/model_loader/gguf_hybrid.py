"""GGUF files of the hybrid Gated DeltaNet family (llama.cpp's `qwen3next`, `qwen35`,
`qwen35moe`) -> ModelArchConfig + Hugging Face-named weights.

Mirrors llama.cpp's conversion/qwen.py (Qwen3NextModel, Qwen3_5TextModel,
Qwen3_5MoeTextModel: the transforms undone here) and src/models/qwen3next.cpp / qwen35.cpp
(metadata read), with gguf-py 0.19's tensor names:
- zero-centred norms are stored as w + 1 (all `*norm` but `ssm_norm`): loaded as w - 1;
- `blk.N.ssm_a` (no suffix) holds -exp(A_log): loaded as A_log = log(-ssm_a);
- `ssm_dt.bias` is dt_bias; `ssm_conv1d` is [C, K] (HF [C, 1, K]);
- Qwen3-Next GDN in-projections come either as `attn_qkv` (Q, K, V of all heads, flat) +
  `attn_gate` (Z), or as the legacy raw group-interleaved `ssm_in`; `ssm_ba` stays
  group-interleaved; Qwen3.5 splits them into `attn_qkv`, `attn_gate`, `ssm_beta`,
  `ssm_alpha`;
- qwen35 / qwen35moe files order value heads "tiled" (head p uses key head p % Hk) where HF
  groups them (head j uses key head j // r): the V rows of attn_qkv, rows of attn_gate /
  ssm_beta / ssm_alpha, entries of ssm_a / ssm_dt, V channels of ssm_conv1d and columns
  of ssm_out are put back in grouped order (llama.cpp PR 19468 reversed);
- MTP blocks (`blk.{L+i}`, `nextn_predict_layers`) are skipped: the trunk is
  block_count - nextn_predict_layers.
Weights are dequantized (the quantized CUDA path of gguf_quant.py is not used for these).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import torch

from libvllm.engine.errors import ModelLoadError, UnsupportedError
from libvllm.engine.gguf.reader import GGUFReader
from libvllm.engine.models.config import ModelArchConfig
from libvllm.engine.models.registry import GGUF_ARCHITECTURES

HYBRID_GGUF_ARCHITECTURES = ("qwen3next", "qwen35", "qwen35moe")
_TILED = ("qwen35", "qwen35moe")  # value heads in tiled order
_BLOCK_RE = re.compile(r"blk\.(\d{1,4})\.([\w.]+?)(?:\.(weight|bias))?")
# GGUF block part -> HF name under model.layers.N (".weight" added unless it ends in a dot)
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_qkv": "linear_attn.in_proj_qkv", "attn_gate": "linear_attn.in_proj_z",
    "ssm_in": "linear_attn.in_proj_qkvz", "ssm_ba": "linear_attn.in_proj_ba",
    "ssm_beta": "linear_attn.in_proj_b", "ssm_alpha": "linear_attn.in_proj_a",
    "ssm_conv1d": "linear_attn.conv1d", "ssm_a": "linear_attn.A_log.",
    "ssm_dt": "linear_attn.dt_bias.", "ssm_norm": "linear_attn.norm",
    "ssm_out": "linear_attn.out_proj",
    "ffn_gate_inp": "mlp.gate", "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
    "ffn_gate_exps": "mlp.experts.gate_proj", "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj", "ffn_gate_up_exps": "mlp.experts.gate_up_proj",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj", "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
                 "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
_PLUS_ONE = ("attn_norm", "post_attention_norm", "attn_q_norm", "attn_k_norm")


def _get(md: dict, key: str, default=None, lo: int = 1, hi: int = 1 << 24) -> int:
    v = md.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise ModelLoadError(f"GGUF metadata {key}={v!r} is invalid or missing")
    return v


def arch_config(reader: GGUFReader, arch: str) -> ModelArchConfig:
    md, a = reader.metadata, arch + "."
    hidden = _get(md, a + "embedding_length")
    heads = _get(md, a + "attention.head_count", hi=4096)
    kv_heads = _get(md, a + "attention.head_count_kv", heads, hi=heads)
    head_dim = _get(md, a + "attention.key_length", hidden // heads, hi=4096)
    rope_dim = _get(md, a + "rope.dimension_count", head_dim, hi=head_dim)
    if heads % kv_heads or rope_dim % 2:
        raise ModelLoadError(f"unsupported head layout: heads={heads} kv_heads={kv_heads} "
                             f"rope_dim={rope_dim}")
    layers = _get(md, a + "block_count", hi=1024) - _get(md, a + "nextn_predict_layers", 0, lo=0)
    hk, hv = _get(md, a + "ssm.group_count"), _get(md, a + "ssm.time_step_rank")
    d = _get(md, a + "ssm.state_size", hi=4096)  # llama.cpp: dk = dv
    if hv % hk or md.get(a + "ssm.inner_size", hv * d) != hv * d or layers < 1:
        raise ModelLoadError(f"unsupported GDN layout: group_count={hk} time_step_rank={hv} "
                             f"state_size={d} inner_size={md.get(a + 'ssm.inner_size')}")
    interval = _get(md, a + "full_attention_interval", 4, hi=1024)
    theta = md.get(a + "rope.freq_base", 10000.0)
    if not isinstance(theta, (int, float)) or not 0 < theta < 1e12:
        raise ModelLoadError(f"GGUF metadata {a}rope.freq_base={theta!r} is invalid")
    if "token_embd.weight" not in reader.tensors:
        raise ModelLoadError("GGUF file has no token_embd.weight")
    experts = _get(md, a + "expert_count", 0, lo=0, hi=4096)
    cfg = ModelArchConfig(
        architecture=arch, name=str(md.get("general.name", "")),
        vocab_size=reader.tensors["token_embd.weight"].shape[0], hidden_size=hidden,
        intermediate_size=_get(md, a + "feed_forward_length", 0, lo=0),
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        head_dim=head_dim, rms_norm_eps=float(md.get(a + "attention.layer_norm_rms_epsilon",
                                                     1e-6)),
        rope_theta=float(theta), max_position_embeddings=_get(md, a + "context_length"),
        tie_word_embeddings="output.weight" not in reader.tensors,
        architectures=(GGUF_ARCHITECTURES[arch],),
        rope_parameters={"rope_type": "default", "rope_theta": float(theta),
                         "partial_rotary_factor": rope_dim / head_dim},
        layer_types=tuple("linear_attention" if (i + 1) % interval else "full_attention"
                          for i in range(layers)),
        linear_num_key_heads=hk, linear_num_value_heads=hv, linear_key_head_dim=d,
        linear_value_head_dim=d, linear_conv_kernel_dim=_get(md, a + "ssm.conv_kernel", 4),
        mamba_ssm_dtype="float32" if arch in _TILED else None)
    if experts:
        cfg.num_experts = experts
        cfg.num_experts_per_tok = _get(md, a + "expert_used_count", hi=experts)
        cfg.moe_intermediate_size = _get(md, a + "expert_feed_forward_length")
        cfg.shared_expert_intermediate_size = _get(
            md, a + "expert_shared_feed_forward_length", 0, lo=0)
    return cfg


def untile_heads(w: torch.Tensor, hk: int, hv: int, dim: int = 0) -> torch.Tensor:
    """Tiled value-head order (head p = i * hk + g) -> grouped (head g * r + i) along `dim`."""
    w = w.movedim(dim, 0)
    r, d = hv // hk, w.shape[0] // hv
    out = w.reshape(r, hk, d, *w.shape[1:]).transpose(0, 1).reshape(w.shape)
    return out.movedim(0, dim).contiguous()


def _hf(name: str, cfg: ModelArchConfig) -> tuple[str, str, int] | None:
    """(HF name, GGUF part, layer) of a GGUF tensor; None for MTP blocks."""
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name], name.split(".")[0], -1
    m = _BLOCK_RE.fullmatch(name)
    if m is None:
        raise UnsupportedError(f"unexpected GGUF tensor {name!r} for {cfg.architecture}")
    layer, part = int(m[1]), m[2]
    if layer >= cfg.num_hidden_layers or part.startswith("nextn"):
        return None  # multi-token-prediction block
    base = _BLOCK_NAMES.get(part)
    if base is None:
        raise UnsupportedError(f"unexpected GGUF tensor {name!r} for {cfg.architecture}")
    if part == "attn_qkv" and cfg.layer_type(layer) != "linear_attention":
        raise UnsupportedError(f"{name}: fused attn_qkv on a full-attention layer is not "
                               "supported")
    hf = f"model.layers.{layer}.{base}"
    return (hf[:-1] if hf.endswith(".") else f"{hf}.{m[3] or 'weight'}"), part, layer


def _transform(part: str, w: torch.Tensor, cfg: ModelArchConfig) -> torch.Tensor:
    hk, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    tiled = cfg.architecture in _TILED and hv != hk
    key_dim = 2 * hk * cfg.linear_key_head_dim
    if part in _PLUS_ONE or part == "output_norm":
        return w - 1
    if part == "ssm_a":
        w = torch.log(-w)
    elif part == "ssm_conv1d":
        w = w.unsqueeze(1)  # [C, 1, K]
    elif part == "ffn_gate_inp_shexp":
        w = w.reshape(1, -1)
    if not tiled:
        return w
    if part in ("attn_qkv", "ssm_conv1d"):
        return torch.cat([w[:key_dim], untile_heads(w[key_dim:], hk, hv)])
    if part in ("attn_gate", "ssm_beta", "ssm_alpha", "ssm_a", "ssm_dt"):
        return untile_heads(w, hk, hv)
    if part == "ssm_out":
        return untile_heads(w, hk, hv, dim=1)
    return w


def weights(reader: GGUFReader, cfg: ModelArchConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """Dequantized fp32 weights under HF names (Qwen3.5 names for the GDN projections)."""
    for name in reader.tensors:
        hit = _hf(name, cfg)
        if hit is None:
            continue
        hf, part, _ = hit
        if part == "ffn_gate_up_exps":  # fused [E, 2I, H]: gate rows, then up
            gate, up = reader.load_tensor(name).chunk(2, dim=1)
            yield hf.replace("gate_up_proj", "gate_proj"), gate
            yield hf.replace("gate_up_proj", "up_proj"), up
            continue
        yield hf, _transform(part, reader.load_tensor(name), cfg)
