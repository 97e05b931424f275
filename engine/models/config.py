"""ModelArchConfig: the architecture hyper-parameters a model file needs.

Field names follow Hugging Face config.json (what vLLM's model files read from
hf_config), whatever format the weights came from; loaders fill it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ModelArchConfig:
    architecture: str  # "llama", ...
    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
