"""KV cache specs of the hybrid cache, as vllm/v1/kv_cache_interface.py (FullAttentionSpec,
MambaSpec and their page_size_bytes), with the Gated DeltaNet state formulas of
vllm/model_executor/layers/mamba/mamba_utils.py (gated_delta_net_state_shape / _dtype) and
the page-size unification of vllm/platforms/interface.py (_align_hybrid_block_size).

A page is one block of one layer in bytes. Attention: K and V of block_size tokens.
A Gated DeltaNet layer's state for one request (conv_state [K-1, conv_dim] in the conv
dtype, ssm_state [Hv, dv, dk] in the SSM dtype, fp32 for Qwen3.5/3.6) is one page of its
MambaSpec. vLLM makes every page the same size so that one block pool serves both: the
attention block size is raised to the smallest multiple of the kernel alignment (16, or
the configured block size if larger) whose page covers the state page, and the state
page is padded to it (544 tokens for Qwen3.5-0.8B, 528 for 4B, 1056 for 35B-A3B).
Plain numbers and dtypes only: the model-config side lives in engine/worker/mamba_utils.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

STR_DTYPE_TO_TORCH_DTYPE = {"float32": torch.float32, "float16": torch.float16,
                            "bfloat16": torch.bfloat16}
KERNEL_BLOCK_ALIGNMENT = 16  # the attention kernels' block-size multiple (vLLM's MultipleOf(16))


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class FullAttentionSpec:
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype

    @property
    def page_size_bytes(self) -> int:
        """K and V of one block of one layer."""
        return 2 * self.block_size * self.num_kv_heads * self.head_size * self.dtype.itemsize


@dataclass(frozen=True)
class MambaSpec:
    shapes: tuple[tuple[int, ...], ...]  # (conv_state, ssm_state) of one request
    dtypes: tuple[torch.dtype, ...]
    block_size: int = -1  # tokens per state block ("none": max_model_len; "align": KV's)
    page_size_padded: int | None = None  # bytes; None: the unpadded sum
    mamba_cache_mode: str = "none"  # vLLM's MambaCacheMode: "none" | "align"

    @property
    def page_size_bytes(self) -> int:
        raw = sum(_numel(s) * d.itemsize for s, d in zip(self.shapes, self.dtypes))
        if self.page_size_padded is not None:
            assert self.page_size_padded >= raw, "padded page smaller than the state"
            return self.page_size_padded
        return raw


def gated_delta_net_state_shape(num_k_heads: int, num_v_heads: int, head_k_dim: int,
                                head_v_dim: int, conv_kernel_size: int, tp_world_size: int = 1,
                                num_spec: int = 0
                                ) -> tuple[tuple[int, int], tuple[int, int, int]]:
    """(conv_state [K-1, conv_dim], ssm_state [Hv, dv, dk]) of one request, this rank's heads."""
    conv_dim = head_k_dim * num_k_heads * 2 + head_v_dim * num_v_heads
    return ((conv_kernel_size - 1 + num_spec, conv_dim // tp_world_size),
            (num_v_heads // tp_world_size, head_v_dim, head_k_dim))


def gated_delta_net_state_dtype(model_dtype: torch.dtype, mamba_cache_dtype: str = "auto",
                                mamba_ssm_cache_dtype: str = "auto"
                                ) -> tuple[torch.dtype, torch.dtype]:
    """(conv, ssm) dtypes: the conv state in mamba_cache_dtype (auto: the model dtype), the
    SSM state in mamba_ssm_cache_dtype (auto: the conv dtype). The caller resolves the
    model config's mamba_ssm_dtype into mamba_ssm_cache_dtype first."""
    conv = model_dtype if mamba_cache_dtype == "auto" \
        else STR_DTYPE_TO_TORCH_DTYPE[mamba_cache_dtype]
    ssm = conv if mamba_ssm_cache_dtype == "auto" \
        else STR_DTYPE_TO_TORCH_DTYPE[mamba_ssm_cache_dtype]
    return conv, ssm


def align_hybrid_block_size(attn_bytes_per_token: int, mamba_page_bytes: int,
                            kernel_block_alignment: int = KERNEL_BLOCK_ALIGNMENT
                            ) -> tuple[int, int]:
    """(attention block size, padded mamba page bytes) making both pages equal, as
    _align_hybrid_block_size: the smallest multiple of the alignment whose attention page
    (block_size * bytes per token of one layer: 2 * kv heads * head_dim * itemsize) is at
    least the state page; the state page is padded to that attention page."""
    per_align = kernel_block_alignment * attn_bytes_per_token
    block_size = kernel_block_alignment * cdiv(mamba_page_bytes, per_align)
    return block_size, block_size * attn_bytes_per_token


def unify_hybrid_specs(attn: FullAttentionSpec, mamba: MambaSpec
                       ) -> tuple[FullAttentionSpec, MambaSpec]:
    """The attention spec with its block size raised (never lowered: a configured block
    size at least as large keeps its own) and the mamba spec padded to the same page,
    as _align_hybrid_block_size with the configured block size as the alignment floor."""
    one = FullAttentionSpec(1, attn.num_kv_heads, attn.head_size, attn.dtype).page_size_bytes
    alignment = max(KERNEL_BLOCK_ALIGNMENT, attn.block_size)
    block_size, _ = align_hybrid_block_size(one, mamba.page_size_bytes, alignment)
    block_size = max(block_size, attn.block_size)
    attn = FullAttentionSpec(block_size, attn.num_kv_heads, attn.head_size, attn.dtype)
    padded = attn.page_size_bytes
    mamba = MambaSpec(mamba.shapes, mamba.dtypes, mamba.block_size,
                      None if padded == mamba.page_size_bytes else padded,
                      mamba.mamba_cache_mode)
    return attn, mamba


@dataclass(frozen=True)
class HybridKVCacheConfig:
    """vLLM's KVCacheConfig for attention + Gated DeltaNet layers: the layers are split
    into groups of `group_size` layers of one kind (kv_cache_utils.group_hybrid_layers);
    buffer t (of group_size, num_blocks pages each) holds the t-th layer of every group,
    so block id b addresses page b of each buffer: KV of an attention block, or one
    request's state in a GDN group."""

    num_blocks: int
    attn_spec: FullAttentionSpec
    mamba_spec: MambaSpec
    attn_groups: tuple[tuple[int, ...], ...]  # attention layer indices; -1: padding
    mamba_groups: tuple[tuple[int, ...], ...]  # GDN layer indices; -1: padding

    @property
    def page_size_bytes(self) -> int:
        assert self.attn_spec.page_size_bytes == self.mamba_spec.page_size_bytes
        return self.attn_spec.page_size_bytes

    @property
    def group_size(self) -> int:
        return len(self.attn_groups[0])

    @property
    def block_bytes(self) -> int:
        """Bytes one block id takes across the buffers."""
        return self.group_size * self.page_size_bytes
