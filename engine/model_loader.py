"""Model loading: resolve a path, read a GGUF, build the model and its weights.

Mirrors vllm/model_executor/model_loader/gguf_loader.py (GGUF tensor names -> HF names)
and transformers' modeling_gguf_pytorch_utils.py (metadata -> config, Q/K un-permute).
Only architectures registered in _MODELS load; anything else is a clear UnsupportedError.
"""

from __future__ import annotations

import os
import re

import torch

from engine.errors import ModelLoadError, UnsupportedError
from engine.gguf.reader import GGUFReader
from engine.models.config import ModelArchConfig
from engine.models.llama import LlamaForCausalLM

_MODELS = {"llama": LlamaForCausalLM}

_GGUF_TO_HF = [
    (r"token_embd\.weight", "model.embed_tokens.weight"),
    (r"output_norm\.weight", "model.norm.weight"),
    (r"output\.weight", "lm_head.weight"),
    (r"blk\.(\d+)\.attn_norm\.weight", r"model.layers.\1.input_layernorm.weight"),
    (r"blk\.(\d+)\.ffn_norm\.weight", r"model.layers.\1.post_attention_layernorm.weight"),
    (r"blk\.(\d+)\.attn_q\.weight", r"model.layers.\1.self_attn.q_proj.weight"),
    (r"blk\.(\d+)\.attn_k\.weight", r"model.layers.\1.self_attn.k_proj.weight"),
    (r"blk\.(\d+)\.attn_v\.weight", r"model.layers.\1.self_attn.v_proj.weight"),
    (r"blk\.(\d+)\.attn_output\.weight", r"model.layers.\1.self_attn.o_proj.weight"),
    (r"blk\.(\d+)\.ffn_gate\.weight", r"model.layers.\1.mlp.gate_proj.weight"),
    (r"blk\.(\d+)\.ffn_up\.weight", r"model.layers.\1.mlp.up_proj.weight"),
    (r"blk\.(\d+)\.ffn_down\.weight", r"model.layers.\1.mlp.down_proj.weight"),
]
_GGUF_TO_HF = [(re.compile(p + "$"), r) for p, r in _GGUF_TO_HF]


def resolve_model_path(path: str) -> str:
    """Return the GGUF file for `path` (a file, or a directory holding exactly one)."""
    if not os.path.exists(path):
        raise ModelLoadError(f"model path does not exist: {path}")
    if os.path.isfile(path):
        return path
    ggufs = sorted(f for f in os.listdir(path) if f.endswith(".gguf"))
    if len(ggufs) == 1:
        return os.path.join(path, ggufs[0])
    if len(ggufs) > 1:
        raise ModelLoadError(f"{path}: several .gguf files, pass one of them: {ggufs}")
    if os.path.exists(os.path.join(path, "config.json")):
        raise UnsupportedError(f"{path}: safetensors model directories are not supported yet")
    raise ModelLoadError(f"{path}: no model found (expected a .gguf file)")


def _get(md: dict, key: str, kind: type, default=None, lo: float = 1, hi: float = 1 << 20):
    v = md.get(key, default)
    if v is None:
        raise ModelLoadError(f"GGUF metadata is missing {key}")
    if kind is float and isinstance(v, int) and not isinstance(v, bool):
        v = float(v)
    if not isinstance(v, kind) or isinstance(v, bool) or not lo <= v <= hi:
        raise ModelLoadError(f"GGUF metadata {key}={v!r} is invalid")
    return v


def arch_config_from_gguf(reader: GGUFReader) -> ModelArchConfig:
    md = reader.metadata
    arch = md.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelLoadError("GGUF metadata is missing general.architecture")
    if arch not in _MODELS:
        raise UnsupportedError(f"architecture {arch!r} is not supported (supported: "
                               f"{', '.join(_MODELS)})")
    a = arch + "."
    hidden = _get(md, a + "embedding_length", int)
    heads = _get(md, a + "attention.head_count", int, hi=4096)
    kv_heads = _get(md, a + "attention.head_count_kv", int, heads, hi=heads)
    head_dim = _get(md, a + "attention.key_length", int, hidden // heads, hi=4096)
    rope_dim = _get(md, a + "rope.dimension_count", int, head_dim, hi=4096)
    if heads % kv_heads or rope_dim != head_dim:
        raise ModelLoadError(f"unsupported head layout: heads={heads} kv_heads={kv_heads} "
                             f"head_dim={head_dim} rope_dim={rope_dim}")
    tokens = md.get("tokenizer.ggml.tokens")
    vocab = _get(md, a + "vocab_size", int, len(tokens) if isinstance(tokens, list) else None)
    return ModelArchConfig(
        architecture=arch,
        name=str(md.get("general.name", "")),
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=_get(md, a + "feed_forward_length", int),
        num_hidden_layers=_get(md, a + "block_count", int, hi=1024),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=_get(md, a + "attention.layer_norm_rms_epsilon", float, lo=0.0, hi=1.0),
        rope_theta=_get(md, a + "rope.freq_base", float, 10000.0, hi=1e12),
        max_position_embeddings=_get(md, a + "context_length", int, hi=1 << 24),
        tie_word_embeddings="output.weight" not in reader.tensors,
    )


def _reverse_permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    # undo llama.cpp's convert permutation (interleaved rope -> rotate-half rows)
    # w: [n_head * head_dim, hidden]
    half = w.shape[0] // n_head // 2
    return w.view(n_head, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def gguf_weights(reader: GGUFReader, cfg: ModelArchConfig) -> dict[str, torch.Tensor]:
    """Dequantized fp32 weights under Hugging Face names."""
    out: dict[str, torch.Tensor] = {}
    for name in reader.tensors:
        hf = next((rx.sub(r, name) for rx, r in _GGUF_TO_HF if rx.match(name)), None)
        if hf is None:
            raise UnsupportedError(f"unexpected GGUF tensor {name!r} for {cfg.architecture}")
        w = reader.load_tensor(name)
        if hf.endswith("q_proj.weight"):
            w = _reverse_permute(w, cfg.num_attention_heads)
        elif hf.endswith("k_proj.weight"):
            w = _reverse_permute(w, cfg.num_key_value_heads)
        out[hf] = w
    return out


def load_model(path: str) -> tuple[torch.nn.Module, ModelArchConfig, GGUFReader]:
    """Load a model from a path; the reader stays open for tokenizer metadata."""
    reader = GGUFReader(resolve_model_path(path))
    cfg = arch_config_from_gguf(reader)
    model = _MODELS[cfg.architecture](cfg)
    model.load_weights(gguf_weights(reader, cfg))
    return model.eval(), cfg, reader
