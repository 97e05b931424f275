"""ModelArchConfig: the architecture hyper-parameters a model file needs.

Field names follow Hugging Face config.json (what vLLM's model files read from
hf_config), whatever format the weights came from; loaders fill it (GGUF metadata in
engine/model_loader/gguf_loader.py, config.json in engine/model_loader/hf_config.py).
`rope_parameters` is the transformers v5 / vLLM 0.33 form: one dict, or one per layer
type ("full_attention", "sliding_attention") for models such as Gemma 3.
get_diff_sampling_param mirrors vllm/config/model.py (ModelConfig.get_diff_sampling_param).
"""

from __future__ import annotations

from dataclasses import dataclass, field

LAYER_TYPES = ("full_attention", "sliding_attention")
HYBRID_LAYER_TYPES = (*LAYER_TYPES, "linear_attention")  # + Gated DeltaNet (Qwen3-Next)


@dataclass
class ModelArchConfig:
    architecture: str  # family reported by vllm_model_info: "llama", "gemma3", "qwen2", ...
    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float  # of full-attention layers; rope_parameters is authoritative
    max_position_embeddings: int
    tie_word_embeddings: bool
    architectures: tuple[str, ...] = ("LlamaForCausalLM",)  # [0] selects the model class
    hidden_act: str = "silu"
    attention_bias: bool = False
    mlp_bias: bool = False
    rope_parameters: dict = field(default_factory=dict)
    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = None  # None: every layer uses sliding_window
    query_pre_attn_scalar: float | None = None  # Gemma: attention scale = this ** -0.5
    final_logit_softcapping: float | None = None
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    generation_config: dict = field(default_factory=dict)  # generation_config.json as read
    # hybrid Gated DeltaNet models (Qwen3-Next / Qwen3.5): the linear-attention layers
    shared_expert_intermediate_size: int = 0
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 4
    mamba_ssm_dtype: str | None = None  # "float32": the recurrent state in fp32 (Qwen3.5)
    # q_proj carries a per-head sigmoid output gate (Qwen3-Next attention)
    attn_output_gate: bool = True
    # vLLM ModelConfig.is_matryoshka / matryoshka_dimensions (the hf config's keys): the
    # pooled vector may be truncated to `dimensions` (pooling requests)
    is_matryoshka: bool = False
    matryoshka_dimensions: tuple[int, ...] | None = None
    # what the checkpoint holds, filled by the loader (vllm_model_info n_params / n_layers):
    # its tensors' elements, its blocks (a GGUF's block_count, MTP blocks included;
    # config.json num_hidden_layers); -1: unknown. checkpoint_metadata: a GGUF's key/values
    checkpoint_numel: int = -1
    checkpoint_layers: int = -1
    checkpoint_metadata: dict | None = None

    def layer_type(self, layer_idx: int) -> str:
        return self.layer_types[layer_idx] if self.layer_types else "full_attention"

    def layer_sliding_window(self, layer_idx: int) -> int | None:
        if self.layer_types is None:
            return self.sliding_window
        return self.sliding_window if self.layer_types[layer_idx] == "sliding_attention" else None

    def layer_rope_parameters(self, layer_idx: int) -> dict:
        p = self.rope_parameters
        if set(p) and set(p) <= set(LAYER_TYPES):
            return p[self.layer_type(layer_idx)]
        return p


_SAMPLING_KEYS = ("repetition_penalty", "presence_penalty", "frequency_penalty", "temperature",
                  "top_k", "top_p", "min_p", "max_new_tokens", "skip_special_tokens")


def get_diff_sampling_param(generation_config: dict) -> dict:
    """The model's default SamplingParams overrides (vLLM names; max_new_tokens -> max_tokens)."""
    diff = {k: generation_config[k] for k in _SAMPLING_KEYS
            if generation_config.get(k) is not None}
    if "max_new_tokens" in diff:
        diff["max_tokens"] = diff.pop("max_new_tokens")
    return diff
