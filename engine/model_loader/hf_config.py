"""config.json / generation_config.json of a Hugging Face directory -> ModelArchConfig.

Mirrors vllm/transformers_utils/config.py (get_config, patch_rope_parameters,
try_get_generation_config) and the defaults of the transformers config classes it relies
on, without importing transformers or any code from the directory (auto_map is ignored).
The files are hostile input: size caps, JSON objects only, every field type- and
range-checked before use; anything wrong is a ModelLoadError naming the field.
"""

from __future__ import annotations

import json
import os

from libvllm.engine.errors import ModelLoadError, UnsupportedError
from libvllm.engine.models.config import HYBRID_LAYER_TYPES, LAYER_TYPES, ModelArchConfig

MAX_CONFIG_BYTES = 4 << 20
_REQUIRED = object()

# per architecture: defaults of its transformers config class that differ from Llama's
_ARCH_DEFAULTS: dict[str, dict] = {
    "MistralForCausalLM": {"sliding_window": 4096},
    "MixtralForCausalLM": {"rope_theta": 1e6, "rms_norm_eps": 1e-5},
    "Gemma3ForCausalLM": {"rope_theta": 1e6, "tie_word_embeddings": True, "sliding_window": 4096,
                          "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256},
    "Qwen3MoeForCausalLM": {"norm_topk_prob": False},
}
# hybrid Gated DeltaNet + gated attention (vllm/model_executor/models/qwen3_next.py, qwen3_5.py)
HYBRID_GDN_ARCHS = {"Qwen3NextForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM",
                    "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration"}
_NO_DENSE_FFN = {"Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration"}
_USES_SLIDING_WINDOW = {"MistralForCausalLM", "MixtralForCausalLM", "Gemma3ForCausalLM",
                        "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM"}
_QWEN = {"Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM"}
_ROPE_KEYS = {"linear": ("factor",),
              "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                         "original_max_position_embeddings"),
              "yarn": ("factor", "original_max_position_embeddings"), "default": ()}


def read_json_object(path: str, max_bytes: int = MAX_CONFIG_BYTES) -> dict:
    """A JSON object from `path`, size-capped; NaN/Infinity and deep nesting rejected."""
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise ModelLoadError(f"cannot read {path}: {e.strerror}") from None
    if len(data) > max_bytes:
        raise ModelLoadError(f"{path} is larger than {max_bytes} bytes")
    try:
        obj = json.loads(data, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:
        raise ModelLoadError(f"{path} is not valid JSON: {str(e)[:200]}") from None
    if not isinstance(obj, dict):
        raise ModelLoadError(f"{path} must hold a JSON object")
    return obj


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not allowed")


def _get(cfg: dict, key: str, kind: type, default: object = _REQUIRED, lo: float = 1,
         hi: float = 1 << 24, src: str = "config.json") -> object:
    v = cfg.get(key)
    if v is None:
        if default is _REQUIRED:
            raise ModelLoadError(f"{src} is missing {key}")
        return default
    if kind is float and isinstance(v, int) and not isinstance(v, bool):
        v = float(v)
    ok = isinstance(v, kind) and (kind is bool or not isinstance(v, bool))
    if not ok or (kind in (int, float) and not lo <= v <= hi):
        raise ModelLoadError(f"{src}: {key}={v!r} is invalid")
    return v


def arch_config_from_hf(cfg: dict, arch: str, name: str) -> ModelArchConfig:
    """ModelArchConfig for HF architecture `arch` (already resolved) from config.json."""
    if arch in HYBRID_GDN_ARCHS and isinstance(cfg.get("text_config"), dict):
        # VL wrapper: the text model's fields, top-level ones (tie_word_embeddings) as defaults
        top = {k: v for k, v in cfg.items() if k not in ("text_config", "vision_config")}
        cfg = {**top, **cfg["text_config"], "architectures": cfg.get("architectures")}
    cfg = {**_ARCH_DEFAULTS.get(arch, {}), **cfg}  # an explicit null stays null
    if cfg.get("use_bidirectional_attention"):
        raise UnsupportedError("use_bidirectional_attention is not supported")
    hidden = _get(cfg, "hidden_size", int, hi=1 << 16)
    heads = _get(cfg, "num_attention_heads", int, hi=4096)
    kv_heads = _get(cfg, "num_key_value_heads", int, heads, hi=heads)
    if heads % kv_heads:
        raise ModelLoadError(f"config.json: num_attention_heads={heads} is not a multiple of "
                             f"num_key_value_heads={kv_heads}")
    layers = _get(cfg, "num_hidden_layers", int, hi=1024)
    max_pos = _get(cfg, "max_position_embeddings", int)
    num_experts = _get(cfg, "num_local_experts", int, 0, lo=0, hi=4096) or _get(
        cfg, "num_experts", int, 0, lo=0, hi=4096)
    sliding_window = _sliding_window(cfg, arch)
    rope = _rope_parameters(cfg, arch, max_pos)
    return ModelArchConfig(
        architecture=_get(cfg, "model_type", str, "") or arch,
        name=name,
        vocab_size=_get(cfg, "vocab_size", int),
        hidden_size=hidden,
        intermediate_size=_get(cfg, "intermediate_size", int,
                               0 if arch in _NO_DENSE_FFN else _REQUIRED, hi=1 << 20),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=_get(cfg, "head_dim", int, hidden // heads, hi=4096),
        rms_norm_eps=_get(cfg, "rms_norm_eps", float, 1e-6, lo=0.0, hi=1.0),
        rope_theta=float(rope.get("full_attention", rope)["rope_theta"]),
        max_position_embeddings=max_pos,
        tie_word_embeddings=_get(cfg, "tie_word_embeddings", bool, False),
        architectures=(arch,),
        hidden_act=_get(cfg, "hidden_act", str, None) or _get(cfg, "hidden_activation", str,
                                                                "silu"),
        attention_bias=_get(cfg, "attention_bias", bool, False),
        mlp_bias=_get(cfg, "mlp_bias", bool, False),
        rope_parameters=rope,
        sliding_window=sliding_window,
        layer_types=_layer_types(cfg, arch, layers, sliding_window),
        query_pre_attn_scalar=_get(cfg, "query_pre_attn_scalar", float, None, lo=1e-6, hi=1e9),
        final_logit_softcapping=_get(cfg, "final_logit_softcapping", float, None, lo=1e-6,
                                     hi=1e9),
        num_experts=num_experts,
        num_experts_per_tok=_get(cfg, "num_experts_per_tok", int, 2 if num_experts else 0,
                                 lo=0, hi=max(num_experts, 1)),
        moe_intermediate_size=_get(cfg, "moe_intermediate_size", int, 0, lo=0, hi=1 << 20),
        norm_topk_prob=_get(cfg, "norm_topk_prob", bool, True),
        decoder_sparse_step=_get(cfg, "decoder_sparse_step", int, 1, hi=1024),
        mlp_only_layers=tuple(_int_list(cfg, "mlp_only_layers", layers)),
        **(_gdn_fields(cfg) if arch in HYBRID_GDN_ARCHS else {}),
        **_matryoshka_fields(cfg, hidden),
    )


def _gdn_fields(cfg: dict) -> dict:
    """The Gated DeltaNet fields of Qwen3NextConfig / Qwen3_5TextConfig (their defaults)."""
    hk = _get(cfg, "linear_num_key_heads", int, 16, hi=4096)
    hv = _get(cfg, "linear_num_value_heads", int, 32, hi=4096)
    if hv % hk:
        raise ModelLoadError(f"config.json: linear_num_value_heads={hv} is not a multiple of "
                             f"linear_num_key_heads={hk}")
    ssm_dtype = _get(cfg, "mamba_ssm_dtype", str, None)
    if ssm_dtype not in (None, "float32", "float16", "bfloat16", "auto"):
        raise ModelLoadError(f"config.json: mamba_ssm_dtype={ssm_dtype!r} is invalid")
    return dict(
        linear_num_key_heads=hk, linear_num_value_heads=hv,
        linear_key_head_dim=_get(cfg, "linear_key_head_dim", int, 128, hi=4096),
        linear_value_head_dim=_get(cfg, "linear_value_head_dim", int, 128, hi=4096),
        linear_conv_kernel_dim=_get(cfg, "linear_conv_kernel_dim", int, 4, lo=2, hi=64),
        shared_expert_intermediate_size=_get(cfg, "shared_expert_intermediate_size", int, 0,
                                             lo=0, hi=1 << 20),
        mamba_ssm_dtype=None if ssm_dtype == "auto" else ssm_dtype,
        attn_output_gate=_get(cfg, "attn_output_gate", bool, True))


def _sliding_window(cfg: dict, arch: str) -> int | None:
    if arch not in _USES_SLIDING_WINDOW:
        return None
    if arch in _QWEN and not _get(cfg, "use_sliding_window", bool, False):
        return None  # transformers' Qwen configs drop the window unless it is enabled
    return _get(cfg, "sliding_window", int, None)


def _layer_types(cfg: dict, arch: str, layers: int, window: int | None
                 ) -> tuple[str, ...] | None:
    types = cfg.get("layer_types")
    allowed = HYBRID_LAYER_TYPES if arch in HYBRID_GDN_ARCHS else LAYER_TYPES
    if types is not None:
        if not isinstance(types, list) or len(types) != layers or \
                any(t not in allowed for t in types):
            raise ModelLoadError(f"config.json: layer_types must list {layers} of "
                                 f"{'/'.join(allowed)}")
        return tuple(types)
    if arch in HYBRID_GDN_ARCHS:  # Qwen3NextConfig: every full_attention_interval-th layer
        interval = _get(cfg, "full_attention_interval", int, 4, hi=1024)
        return tuple("linear_attention" if (i + 1) % interval else "full_attention"
                     for i in range(layers))
    if arch == "Gemma3ForCausalLM":
        pattern = _get(cfg, "sliding_window_pattern", int, None, hi=1024) or _get(
            cfg, "_sliding_window_pattern", int, 6, hi=1024)
        return tuple("sliding_attention" if (i + 1) % pattern else "full_attention"
                     for i in range(layers))
    if arch in _QWEN and window is not None:
        first = _get(cfg, "max_window_layers", int, 28, lo=0, hi=1 << 20)
        return tuple("sliding_attention" if i >= first else "full_attention"
                     for i in range(layers))
    return None


def _matryoshka_fields(cfg: dict, hidden: int) -> dict:
    """vLLM's ModelConfig.is_matryoshka (a non-empty matryoshka_dimensions or the
    is_matryoshka flag) and matryoshka_dimensions, validated."""
    dims = cfg.get("matryoshka_dimensions")
    if dims is not None and (not isinstance(dims, list) or len(dims) > 64 or any(
            not isinstance(d, int) or isinstance(d, bool) or not 1 <= d <= hidden
            for d in dims)):
        raise ModelLoadError("config.json: matryoshka_dimensions must be a list of sizes in "
                             f"[1, {hidden}]")
    return {"is_matryoshka": bool(dims) or _get(cfg, "is_matryoshka", bool, False),
            "matryoshka_dimensions": tuple(dims) if dims else None}


def _int_list(cfg: dict, key: str, bound: int) -> list[int]:
    v = cfg.get(key, [])
    if not isinstance(v, list) or len(v) > bound or any(
            not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < bound for i in v):
        raise ModelLoadError(f"config.json: {key} must be a list of layer indices")
    return v


def _rope_parameters(cfg: dict, arch: str, max_pos: int) -> dict:
    """transformers v5 rope_parameters (flat, or per layer type), validated."""
    rp = cfg.get("rope_parameters")
    thetas = {"full_attention": cfg.get("rope_theta") or 10000.0,
              "sliding_attention": cfg.get("rope_local_base_freq") or 10000.0}
    if rp is None:
        scaling = cfg.get("rope_scaling") or {}
        if not isinstance(scaling, dict):
            raise ModelLoadError("config.json: rope_scaling must be an object")
        # Gemma 3: rope_scaling applies to the global layers only
        rp = {"full_attention": scaling, "sliding_attention": {}} \
            if arch == "Gemma3ForCausalLM" else scaling
    if not isinstance(rp, dict):
        raise ModelLoadError("config.json: rope_parameters must be an object")
    if not (rp and set(rp) <= set(LAYER_TYPES)):
        return _one_rope(rp, cfg, thetas["full_attention"], max_pos)
    return {k: _one_rope(rp.get(k) or {}, cfg, thetas[k], max_pos) for k in LAYER_TYPES}


def _one_rope(p: object, cfg: dict, theta: object, max_pos: int) -> dict:
    if not isinstance(p, dict):
        raise ModelLoadError("config.json: rope parameters must be an object")
    p = dict(p)
    p.setdefault("rope_type", p.pop("type", "default"))
    p.pop("type", None)
    if p.get("rope_theta") is None:
        p["rope_theta"] = theta
    if "partial_rotary_factor" in cfg:
        p.setdefault("partial_rotary_factor", cfg["partial_rotary_factor"])
    rope_type = p["rope_type"]
    if rope_type not in _ROPE_KEYS:
        raise UnsupportedError(f"rope_type {rope_type!r} is not supported "
                               f"(supported: {', '.join(_ROPE_KEYS)})")
    if rope_type in ("llama3", "yarn"):
        top = cfg.get("original_max_position_embeddings")
        if top is not None:
            p["original_max_position_embeddings"] = top
        p.setdefault("original_max_position_embeddings", max_pos)
    for key in ("rope_theta", *_ROPE_KEYS[rope_type]):
        _get(p, key, float, lo=1e-6, hi=1e12)
    for key in ("beta_fast", "beta_slow", "attention_factor"):
        _get(p, key, float, None, lo=1e-6, hi=1e6)
    _get(p, "partial_rotary_factor", float, None, lo=1e-6, hi=1.0)
    return p


_GENERATION_TYPES = {"temperature": float, "top_p": float, "min_p": float,
                     "repetition_penalty": float, "presence_penalty": float,
                     "frequency_penalty": float, "top_k": int, "max_new_tokens": int,
                     "skip_special_tokens": bool}


def read_generation_config(model_dir: str) -> dict:
    """generation_config.json as a dict ({} when absent), as try_get_generation_config;
    the sampling fields and eos_token_id are type-checked."""
    path = os.path.join(model_dir, "generation_config.json")
    if not os.path.isfile(path):
        return {}
    gen = read_json_object(path)
    for key, kind in _GENERATION_TYPES.items():
        _get(gen, key, kind, None, lo=-(1 << 31), hi=1 << 31, src=path)
    eos = gen.get("eos_token_id")
    ids = eos if isinstance(eos, list) else [eos]
    if eos is not None and (len(ids) > 1024 or any(
            not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < 1 << 31 for i in ids)):
        raise ModelLoadError(f"{path}: eos_token_id={eos!r} is invalid")
    return gen
