"""GGUF file -> ModelArchConfig + Hugging Face-named weights.

Mirrors transformers' modeling_gguf_pytorch_utils.py / integrations/ggml.py (metadata ->
config, tensor names, Llama Q/K un-permute, Gemma norms stored as 1 + w) and, where
transformers has no rule, llama.cpp (src/llama-model.cpp): `rope_freqs` (Llama 3 frequency
factors), Gemma 3's local rope base (10000) and sliding-window pattern (every 6th layer
global), rope scaling applied to Gemma 3's global layers only. Mixture-of-experts files in
llama.cpp's layout (convert_hf_to_gguf.py): `{arch}.expert_count` / `expert_used_count` /
`expert_feed_forward_length`, the router `ffn_gate_inp` and each layer's experts stacked as
`ffn_gate_exps` / `ffn_up_exps` [E, I, H] and `ffn_down_exps` [E, H, I]; "qwen3moe" is
Qwen3-MoE, "llama" with experts is Mixtral (vLLM's gguf_loader.py maps them the same way).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import torch

from libvllm.engine.errors import ModelLoadError, UnsupportedError
from libvllm.engine.gguf.reader import GGUFReader
from libvllm.engine.model_loader import gguf_hybrid
from libvllm.engine.models.config import ModelArchConfig
from libvllm.engine.models.registry import GGUF_ARCHITECTURES

_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
}
# GGUF architectures whose model class is only chosen here (MoE): name -> HF architecture
_MOE_ARCHITECTURES = {"qwen3moe": "Qwen3MoeForCausalLM"}
_GEMMA3_BLOCK_NAMES = {
    **_BLOCK_NAMES,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_BLOCK_RE = re.compile(r"blk\.(\d{1,4})\.(\w+)\.(weight|bias)")
_GLOBAL_RE = re.compile(r"(\w+)\.(weight|bias)")


def _get(md: dict, key: str, kind: type, default=None, lo: float = 1, hi: float = 1 << 20):
    v = md.get(key, default)
    if v is None:
        raise ModelLoadError(f"GGUF metadata is missing {key}")
    if kind is float and isinstance(v, int) and not isinstance(v, bool):
        v = float(v)
    if not isinstance(v, kind) or isinstance(v, bool) or not lo <= v <= hi:
        raise ModelLoadError(f"GGUF metadata {key}={v!r} is invalid")
    return v


def generation_config(md: dict, vocab_size: int) -> dict:
    """{"eos_token_id": [...]} of the file's end-of-generation ids (eos, eot, eom: llama.cpp
    llama-vocab.cpp special_eog_ids, without its token-text guesses), {} when it names
    none; the front end adds them to each request's stop ids as vLLM does with
    generation_config.json (engine/sampling_params.py update_from_generation_config), the
    tokenizer's own eos aside."""
    ids = {_get(md, f"tokenizer.ggml.{kind}_token_id", int, lo=0, hi=vocab_size - 1)
           for kind in ("eos", "eot", "eom") if f"tokenizer.ggml.{kind}_token_id" in md}
    return {"eos_token_id": sorted(ids)} if ids else {}


def arch_config_from_gguf(reader: GGUFReader) -> ModelArchConfig:
    md = reader.metadata
    arch = md.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelLoadError("GGUF metadata is missing general.architecture")
    if arch in gguf_hybrid.HYBRID_GGUF_ARCHITECTURES:  # qwen3next / qwen35 / qwen35moe
        return gguf_hybrid.arch_config(reader, arch)
    if arch not in GGUF_ARCHITECTURES and arch not in _MOE_ARCHITECTURES:
        raise UnsupportedError(f"architecture {arch!r} is not supported (supported: "
                               f"{', '.join([*GGUF_ARCHITECTURES, *_MOE_ARCHITECTURES])})")
    a = arch + "."
    hidden = _get(md, a + "embedding_length", int)
    heads = _get(md, a + "attention.head_count", int, hi=4096)
    kv_heads = _get(md, a + "attention.head_count_kv", int, heads, hi=heads)
    head_dim = _get(md, a + "attention.key_length", int, hidden // heads, hi=4096)
    rope_dim = _get(md, a + "rope.dimension_count", int, head_dim, hi=4096)
    value_dim = _get(md, a + "attention.value_length", int, head_dim, hi=4096)
    if heads % kv_heads or rope_dim != head_dim or value_dim != head_dim:
        raise ModelLoadError(f"unsupported head layout: heads={heads} kv_heads={kv_heads} "
                             f"head_dim={head_dim} rope_dim={rope_dim} value_dim={value_dim}")
    if "token_embd.weight" not in reader.tensors:
        raise ModelLoadError("GGUF file has no token_embd.weight")
    vocab = _get(md, a + "vocab_size", int, reader.tensors["token_embd.weight"].shape[0],
                 hi=1 << 24)
    layers = _get(md, a + "block_count", int, hi=1024)
    max_pos = _get(md, a + "context_length", int, hi=1 << 24)
    theta = _get(md, a + "rope.freq_base", float, 10000.0, lo=1e-6, hi=1e12)
    rope = {"rope_type": "default", "rope_theta": theta, **_rope_scaling(md, a, max_pos)}
    if "rope_freqs.weight" in reader.tensors:
        freqs = reader.load_tensor("rope_freqs.weight")
        if freqs.shape != (head_dim // 2,) or not bool((freqs > 0).all()):
            raise ModelLoadError(f"rope_freqs.weight {tuple(freqs.shape)} is invalid")
        rope["freq_factors"] = freqs.tolist()
    cfg = ModelArchConfig(
        architecture=arch,
        name=str(md.get("general.name", "")),
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=_get(md, a + "feed_forward_length", int,
                               md.get(a + "expert_feed_forward_length")),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=_get(md, a + "attention.layer_norm_rms_epsilon", float, lo=0.0, hi=1.0),
        rope_theta=theta,
        max_position_embeddings=max_pos,
        tie_word_embeddings="output.weight" not in reader.tensors,
        architectures=(GGUF_ARCHITECTURES.get(arch) or _MOE_ARCHITECTURES[arch],),
        rope_parameters=rope,
    )
    if arch == "gemma3":
        _gemma3(cfg, md, a)
    if md.get(a + "expert_count"):
        _moe(cfg, md, a, reader)
    return cfg


def _moe(cfg: ModelArchConfig, md: dict, a: str, reader: GGUFReader) -> None:
    if cfg.architecture not in ("llama", "qwen3moe"):
        raise UnsupportedError(f"GGUF mixture-of-experts for {cfg.architecture!r} is not "
                               f"supported (llama = Mixtral, qwen3moe)")
    cfg.num_experts = _get(md, a + "expert_count", int, hi=4096)
    cfg.num_experts_per_tok = _get(md, a + "expert_used_count", int, hi=cfg.num_experts)
    if cfg.architecture == "llama":
        cfg.architectures = ("MixtralForCausalLM",)
        return
    cfg.moe_intermediate_size = _get(md, a + "expert_feed_forward_length", int)
    cfg.norm_topk_prob = bool(md.get(a + "expert_weights_norm", True))
    # llama.cpp has no per-layer switch; a layer without stacked experts is a dense MLP
    cfg.mlp_only_layers = tuple(i for i in range(cfg.num_hidden_layers)
                                if f"blk.{i}.ffn_gate_exps.weight" not in reader.tensors)


def _rope_scaling(md: dict, a: str, max_pos: int) -> dict:
    kind = md.get(a + "rope.scaling.type")
    if kind in (None, "none"):
        return {}
    factor = _get(md, a + "rope.scaling.factor", float, lo=1e-6, hi=1e6)
    if kind == "linear":
        return {"rope_type": "linear", "factor": factor}
    if kind == "yarn":
        orig = _get(md, a + "rope.scaling.original_context_length", int, max_pos, hi=1 << 24)
        return {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": orig}
    raise UnsupportedError(f"GGUF rope scaling type {kind!r} is not supported")


def _gemma3(cfg: ModelArchConfig, md: dict, a: str) -> None:
    cfg.hidden_act = "gelu_pytorch_tanh"
    cfg.sliding_window = _get(md, a + "attention.sliding_window", int, 4096, hi=1 << 24)
    cfg.layer_types = tuple("sliding_attention" if (i + 1) % 6 else "full_attention"
                            for i in range(cfg.num_hidden_layers))
    # llama.cpp: 1/sqrt(head_dim), except Gemma 3 27B (62 layers): 1/sqrt(hidden / heads)
    cfg.query_pre_attn_scalar = float(cfg.hidden_size // cfg.num_attention_heads
                                      if cfg.num_hidden_layers == 62 else cfg.head_dim)
    cap = md.get(a + "final_logit_softcapping")
    cfg.final_logit_softcapping = None if cap is None else _get(
        md, a + "final_logit_softcapping", float, lo=1e-6, hi=1e9)
    cfg.rope_parameters = {"full_attention": cfg.rope_parameters,
                           "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}


def _reverse_permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    # undo llama.cpp's convert permutation (interleaved rope -> rotate-half rows)
    # w: [n_head * head_dim, hidden] (or [n_head * head_dim] for a bias)
    if w.shape[0] % (2 * n_head):
        raise ModelLoadError(f"Q/K tensor of {w.shape[0]} rows does not split into {n_head} heads")
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _hf_name(name: str, cfg: ModelArchConfig) -> str | None:
    """HF name of GGUF tensor `name`; None for tensors that are not weights (rope_freqs)."""
    if name == "rope_freqs.weight":
        return None
    m = _BLOCK_RE.fullmatch(name)
    if m:
        table = _GEMMA3_BLOCK_NAMES if cfg.architecture == "gemma3" else _BLOCK_NAMES
        layer, part, kind = int(m[1]), table.get(m[2]), m[3]
        if part is not None and layer < cfg.num_hidden_layers:
            return f"model.layers.{layer}.{part}.{kind}"
    m = _GLOBAL_RE.fullmatch(name)
    if m and m[1] in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[m[1]]}.{m[2]}"
    raise UnsupportedError(f"unexpected GGUF tensor {name!r} for {cfg.architecture}")


def gguf_weights_iterator(reader: GGUFReader, cfg: ModelArchConfig,
                          skip: set[str] = frozenset()
                          ) -> Iterator[tuple[str, torch.Tensor]]:
    """Dequantized fp32 weights under Hugging Face names, one at a time; GGUF tensors
    named in `skip` (kept quantized elsewhere) are left out."""
    if cfg.architecture in gguf_hybrid.HYBRID_GGUF_ARCHITECTURES:
        yield from gguf_hybrid.weights(reader, cfg)
        return
    for name in reader.tensors:
        hf = _hf_name(name, cfg)
        if hf is None or name in skip:
            continue
        w = reader.load_tensor(name)
        if cfg.architecture == "llama" and ".q_proj." in hf:
            w = _reverse_permute(w, cfg.num_attention_heads)
        elif cfg.architecture == "llama" and ".k_proj." in hf:
            w = _reverse_permute(w, cfg.num_key_value_heads)
        elif cfg.architecture == "gemma3" and hf.endswith("norm.weight"):
            w = w - 1  # convert_hf_to_gguf stores Gemma's norm weights as 1 + w
        yield hf, w


def checkpoint_numel(reader: GGUFReader) -> int:
    return sum(info.n_elements for info in reader.tensors.values())


def checkpoint_layers(md: dict) -> int:
    """The file's <arch>.block_count (MTP blocks included); -1: none."""
    layers = md.get(f"{md.get('general.architecture')}.block_count", -1)
    return layers if isinstance(layers, int) and not isinstance(layers, bool) else -1
