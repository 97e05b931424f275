"""The hybrid cache's state spec for Gated DeltaNet layers, as vLLM v1's MambaSpec
(vllm/v1/kv_cache_interface.py), the GDN state formulas of
vllm/model_executor/layers/mamba/mamba_utils.py (gated_delta_net_state_shape / _dtype) and
the page-size unification of vllm/platforms/interface.py (_align_hybrid_block_size).

Per GDN layer and request slot the state is (conv_state [K-1, conv_dim] in the model
dtype, ssm_state [Hv, dv, dk] in the model dtype or fp32 where the config says
`mamba_ssm_dtype: float32`, Qwen3.5/3.6). vLLM packs both in one page and makes every
KV cache group's page the same size in bytes: the attention block size is raised to a
multiple of the kernel alignment (16) whose page covers the state page, and the state page
is padded to it (544 tokens for Qwen3.5-0.8B, 528 for 4B). Our runner keeps the state in
its own slot pool ("none" mode: one slot per running request, engine/worker/mamba_utils.py);
`mamba_state_bytes` is what that pool takes, for the KV cache budget.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.models.config import ModelArchConfig

_SSM_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class MambaSpec:
    shapes: tuple[tuple[int, ...], ...]  # (conv_state, ssm_state) per slot
    dtypes: tuple[torch.dtype, ...]
    page_size_padded: int | None = None  # bytes; None: the unpadded sum
    mamba_cache_mode: str = "none"  # vLLM's MambaCacheMode: "none" | "align"

    @property
    def page_size_bytes(self) -> int:
        raw = sum(_numel(s) * d.itemsize for s, d in zip(self.shapes, self.dtypes))
        if self.page_size_padded is not None:
            assert self.page_size_padded >= raw, "padded page smaller than the state"
            return self.page_size_padded
        return raw


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def is_hybrid_gdn(cfg: ModelArchConfig) -> bool:
    return bool(cfg.layer_types) and "linear_attention" in cfg.layer_types


def num_gdn_layers(cfg: ModelArchConfig) -> int:
    return sum(t == "linear_attention" for t in cfg.layer_types or ())


def num_attention_layers(cfg: ModelArchConfig) -> int:
    """Layers that hold a paged KV cache (all layers for a non-hybrid model)."""
    return cfg.num_hidden_layers - num_gdn_layers(cfg)


def gdn_state_dtypes(cfg: ModelArchConfig, model_dtype: torch.dtype
                     ) -> tuple[torch.dtype, torch.dtype]:
    """(conv, ssm) dtypes: gated_delta_net_state_dtype with mamba_ssm_dtype from the config."""
    return model_dtype, _SSM_DTYPES.get(cfg.mamba_ssm_dtype or "", model_dtype)


def gdn_state_shapes(cfg: ModelArchConfig, num_spec: int = 0
                     ) -> tuple[tuple[int, int], tuple[int, int, int]]:
    """(conv_state, ssm_state) shapes of one slot: gated_delta_net_state_shape (TP 1)."""
    conv_dim = 2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim \
        + cfg.linear_num_value_heads * cfg.linear_value_head_dim
    return ((cfg.linear_conv_kernel_dim - 1 + num_spec, conv_dim),
            (cfg.linear_num_value_heads, cfg.linear_value_head_dim, cfg.linear_key_head_dim))


def gdn_mamba_spec(cfg: ModelArchConfig, model_dtype: torch.dtype) -> MambaSpec:
    return MambaSpec(gdn_state_shapes(cfg), gdn_state_dtypes(cfg, model_dtype))


def mamba_state_bytes(cfg: ModelArchConfig, model_dtype: torch.dtype, num_slots: int) -> int:
    """Bytes of the runner's state pool: num_slots (+ the null slot) per GDN layer; 0 for a
    model without GDN layers."""
    layers = num_gdn_layers(cfg)
    if not layers:
        return 0
    return layers * (num_slots + 1) * gdn_mamba_spec(cfg, model_dtype).page_size_bytes


def align_hybrid_block_size(attn_bytes_per_token: int, mamba_page_bytes: int,
                            kernel_block_alignment: int = 16) -> tuple[int, int]:
    """(attention block size, padded mamba page bytes) making both pages equal, as
    _align_hybrid_block_size: the smallest multiple of the alignment whose attention page
    (block_size * bytes per token of one layer: 2 * kv heads * head_dim * itemsize) is at
    least the state page; the state page is padded to that attention page."""
    per_align = kernel_block_alignment * attn_bytes_per_token
    block_size = kernel_block_alignment * -(-mamba_page_bytes // per_align)
    return block_size, block_size * attn_bytes_per_token
