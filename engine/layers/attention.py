"""Paged attention layer and its per-step metadata (torch reference path).

Mirrors vllm/attention/layer.py (Attention) and the metadata shape of
vllm/v1/attention/backends/*: one flat batch of query tokens from many requests,
a slot mapping that says where each new K/V goes in the paged cache, and a block
table per request. On CUDA the layer runs the Triton kernels (kernels/reshape_and_cache.py,
kernels/paged_attention.py: the decode kernel when every request has one query token,
else the unified varlen kernel, which takes prefill, chunked-prefill and decode rows in one
launch whose grid depends only on the token and request-row counts; an eager mixed step
whose first rows decode (the scheduler's order: running requests first) gives those rows
to the decode kernel and the rest to the unified one, vLLM's split_decodes_and_prefills in
vllm/v1/attention/backends/utils.py) on the device copies of
the metadata, with no host sync, so any step can be captured in a CUDA graph
(vllm/v1/attention/backends/triton_attn.py, AttentionCGSupport.ALWAYS); batch-1 decode
of a Llama-family layer (forward_qkv) writes its K/V in the qkv GEMV's epilogue
(kernels/gemv_rope_cache.py);
`paged_attention_ref` is the CPU path and the kernels' test oracle. Without metadata
(vLLM's profile run) the layer skips the cache and attention and returns zeros.

Sliding window (vLLM's `per_layer_sliding_window`): a query at position p sees keys at
positions p - window + 1 .. p, as flash-attention's window (window - 1, 0) and
transformers' sliding-window mask. The KV cache still keeps every block.

KV-cache dtype (vLLM's --kv-cache-dtype): a float8_e4m3fn cache stores x / scale and reads
fp8 * scale with the layer's per-tensor k_scale / v_scale (vLLM's _k_scale / _v_scale:
float32 [] device tensors, made from kv_scale_values when the cache is bound; the values
come from engine/layers/kv_scales.py, or with calculate_kv_scales from the first forward
with tokens, engine/layers/kv_cache_dtype.py calc_kv_scales); every path (the torch
reference and each kernel that writes or reads the cache) takes them. A float cache
ignores the scales.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from libvllm.engine import envs
from libvllm.engine.layers import linear
from libvllm.engine.layers.kv_cache_dtype import (
    FP8_KV_DTYPE,
    calc_kv_scales,
    dequantize_kv,
    quantize_kv,
)

NO_SPLIT_SEQ_LEN = 512  # eager decode: no split-K (one launch, no reduce) up to this context


@dataclass
class AttentionMetadata:
    num_actual_tokens: int
    slot_mapping: torch.Tensor  # [num_tokens] int64: block_id * block_size + offset
    query_start_loc: list[int]  # [num_reqs + 1] cumulative query lengths (host)
    seq_lens: list[int]  # [num_reqs] context length incl. this step's tokens (host)
    block_table: torch.Tensor  # [num_reqs, max_num_blocks] int32
    # device copies for the CUDA kernels (None on CPU); padded rows have seq_len 0, slot -1
    query_start_loc_t: torch.Tensor | None = None  # [num_reqs + 1] int32
    seq_lens_t: torch.Tensor | None = None  # [num_reqs] int32
    # 1 with one request row per token: a uniform decode batch (the decode kernel); a
    # mixed CUDA graph has more rows than tokens' requests (padding) and takes the
    # unified varlen kernel for any batch
    max_query_len: int = 0
    # longest context of the step (host), 0 when unknown (a CUDA graph): decode splits
    # the KV range only past NO_SPLIT_SEQ_LEN
    max_seq_len: int = 0
    # hybrid models: per KV cache group of Gated DeltaNet layers, its state blocks
    # (a list of engine/layers/gdn.py GDNMetadata)
    gdn: object | None = None
    # an eager mixed step: its first num_decodes rows have one query token each (the decode
    # kernel's, at its occupancy); the query_start_loc of the rows after them, rebased to
    # their first token, made by the first layer ([num_reqs - num_decodes + 1] int32)
    num_decodes: int = 0
    prefill_query_start_loc_t: torch.Tensor | None = None


def num_leading_decodes(num_scheduled: np.ndarray) -> int:
    """How many of a step's first request rows schedule one token each ([num_reqs] ints)."""
    more = np.flatnonzero(num_scheduled != 1)
    return int(more[0]) if more.size else len(num_scheduled)


def use_kernels(q: torch.Tensor) -> bool:
    """Whether a layer runs the Triton kernels (CUDA) or their torch references: this
    module's attention and engine/layers/gdn.py (which imports it). Tests run the kernels
    on CPU under the Triton interpreter by patching the name in the module they test."""
    return q.is_cuda


@functools.cache
def _qkv_rope_fold_enabled() -> bool:
    return not envs.LIBVLLM_DISABLE_QKV_ROPE_FOLD


class Attention(nn.Module):
    """Writes this step's K/V into the paged cache, then attends causally over it."""

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int,
                 per_layer_sliding_window: int | None = None) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = scale
        self.num_kv_heads = num_kv_heads
        self.sliding_window = per_layer_sliding_window  # None: full causal attention
        # the checkpoint's k_scale, v_scale (-1.0: absent; engine/layers/kv_scales.py)
        self.checkpoint_kv_scales = [-1.0, -1.0]
        self.kv_scale_values = (1.0, 1.0)  # host (k, v): the scales of the next bound cache
        self.calculate_kv_scales = False  # k/v scales from the first forward with tokens
        # float32 [] each on the cache's device, and the [] bool "not calculated yet" flag
        self.k_scale: torch.Tensor | None = None
        self.v_scale: torch.Tensor | None = None
        self._kv_scales_pending: torch.Tensor | None = None
        # [2, num_blocks, block_size, num_kv_heads, head_size], bound by the model runner
        self.kv_cache: torch.Tensor | None = None

    @property
    def kv_cache(self) -> torch.Tensor | None:
        return self._kv_cache

    @kv_cache.setter
    def kv_cache(self, cache: torch.Tensor | None) -> None:
        """Bind the cache, and the k/v scale tensors on its device (vLLM's bind_kv_cache)."""
        self._kv_cache = cache
        if cache is not None:
            self.k_scale, self.v_scale = (torch.tensor(s, dtype=torch.float32,
                                                       device=cache.device)
                                          for s in self.kv_scale_values)
            self._kv_scales_pending = torch.ones((), dtype=torch.bool, device=cache.device)

    def forward_qkv(self, hidden_states: torch.Tensor, qkv_proj: nn.Module,
                    md: AttentionMetadata, positions: torch.Tensor, rotary_emb: nn.Module,
                    qk_norm: tuple[nn.Module, nn.Module] | None = None) -> torch.Tensor:
        """self(q, k, v, ...) of qkv_proj(hidden_states) (a QKVParallelLinear) split. One
        bf16/fp16 token on CUDA (batch-1 decode) with a dense qkv weight, full rotary and no
        q/k norm takes the qkv GEMV, RoPE and the KV-cache write in one kernel
        (kernels/gemv_rope_cache.py) instead of the GEMV and kernels/rotary_cache.py;
        LIBVLLM_DISABLE_QKV_ROPE_FOLD=1 turns that off."""
        # hidden_states: [num_tokens, hidden] -> [num_tokens, nq * hd]
        x, nq, nkv, hd = hidden_states, self.num_heads, self.num_kv_heads, self.head_size
        # every RotaryEmbedding here is NeoX rotate-half (engine/layers/rotary_embedding.py)
        if (x.shape[0] == 1 and md is not None and qk_norm is None and use_kernels(x)
                and rotary_emb.rotary_dim == hd and qkv_proj.gguf_weight is None
                and linear._one_row_gemv(x, qkv_proj.weight, qkv_proj.bias)
                and _qkv_rope_fold_enabled() and not self.calculate_kv_scales):
            from libvllm.kernels.gemv_rope_cache import qkv_gemv_rope_cache

            q = qkv_gemv_rope_cache(x, qkv_proj.weight, qkv_proj.bias, positions,
                                    rotary_emb.cos_sin_cache_on(x.device), self.kv_cache,
                                    md.slot_mapping, nq, nkv, hd, k_scale=self.k_scale,
                                    v_scale=self.v_scale)  # [1, nq * hd]
            return self._attend_cuda(q.view(1, nq, hd), md, None)
        q, k, v = qkv_proj(x).split([nq * hd, nkv * hd, nkv * hd], dim=-1)
        return self(q, k, v, md, positions, rotary_emb, qk_norm)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, md: AttentionMetadata,
        positions: torch.Tensor | None = None, rotary_emb: nn.Module | None = None,
        qk_norm: tuple[nn.Module, nn.Module] | None = None,
        output_gate: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """With rotary_emb (engine/layers/rotary_embedding.py), q and k are rotated by
        positions first; on CUDA that rotation is fused with the KV-cache write
        (kernels/rotary_cache.py), one launch instead of two. qk_norm, the (q_norm, k_norm)
        RMSNorm pair of Qwen3 / Gemma 3 / Qwen3-Next (engine/layers/layernorm.py), normalizes
        each q and k head before the rotation; on CUDA with rotary_emb that kernel does it
        too (vLLM's fused_qknorm_rope_cache), four launches in one. output_gate (Qwen3-Next's
        gated attention, [num_tokens, nq, hd]) scales the output by sigmoid(output_gate);
        on CUDA the attention kernel's store does it. q and output_gate may be strided
        [num_tokens, nq, hd] views (the rows of q_proj's interleaved [q_h | gate_h]): on
        CUDA with rotary_emb no copy is made. While the k/v scales are to be calculated
        the rotation runs unfused, so that they come from the cached (rotated) keys."""
        # q: [num_tokens, nq * hd] or [num_tokens, nq, hd]; k, v: [num_tokens, nkv * hd]
        # -> [num_tokens, nq * hd]
        n = q.shape[0]
        fused = (rotary_emb is not None and md is not None and use_kernels(q)
                 and not self.calculate_kv_scales)
        if q.dim() == 3 and not fused:
            q = q.reshape(n, -1)
        if qk_norm is not None and not fused:
            q = qk_norm[0](q.unflatten(-1, (self.num_heads, self.head_size))).flatten(-2)
            k = qk_norm[1](k.unflatten(-1, (self.num_kv_heads, self.head_size))).flatten(-2)
            qk_norm = None
        if rotary_emb is not None and not fused:
            q, k = rotary_emb(positions, q, k)
            rotary_emb = None
        if md is None:  # profile run: activations only
            return q.new_zeros(n, self.num_heads * self.head_size)
        k = k.view(n, self.num_kv_heads, self.head_size)
        v = v.view(n, self.num_kv_heads, self.head_size)
        if self.calculate_kv_scales:
            calc_kv_scales(k, v, md.slot_mapping, self.k_scale, self.v_scale,
                           self._kv_scales_pending)
            # an eager step with requests (a graph's capture has none): done; graphs
            # captured before keep the device-side check, which the flag now skips
            self.calculate_kv_scales = not md.seq_lens
        if use_kernels(q):
            return self._forward_cuda(q.view(n, self.num_heads, self.head_size), k, v, md,
                                      positions, rotary_emb, qk_norm, output_gate)
        reshape_and_cache(k, v, self.kv_cache, md.slot_mapping, self.k_scale, self.v_scale)
        out = paged_attention_ref(q.view(n, self.num_heads, self.head_size), self.kv_cache, md,
                                  self.scale, self.sliding_window, self.k_scale, self.v_scale)
        if output_gate is not None:
            out = out * torch.sigmoid(output_gate)
        return out.reshape(n, self.num_heads * self.head_size)

    def _forward_cuda(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      md: AttentionMetadata, positions: torch.Tensor | None,
                      rotary_emb: nn.Module | None,
                      qk_norm: tuple[nn.Module, nn.Module] | None,
                      output_gate: torch.Tensor | None) -> torch.Tensor:
        # q, output_gate: [n, nq, hd]; k, v: [n, nkv, hd] -> [n, nq * hd]
        from libvllm.kernels.reshape_and_cache import reshape_and_cache as cache_kernel
        from libvllm.kernels.rotary_cache import rotary_embedding_and_cache

        if rotary_emb is not None:
            # the q/k norms: weights [hd] each; one eps and form (models build both alike)
            norm = () if qk_norm is None else (qk_norm[0].weight, qk_norm[1].weight,
                                               qk_norm[0].variance_epsilon,
                                               qk_norm[0].weight_offset)
            rotary_embedding_and_cache(positions, q, k, v,
                                       rotary_emb.cos_sin_cache_on(q.device),
                                       rotary_emb.head_size, self.kv_cache, md.slot_mapping,
                                       *norm, k_scale=self.k_scale, v_scale=self.v_scale)
        else:
            cache_kernel(k, v, self.kv_cache, md.slot_mapping, self.k_scale, self.v_scale)
        return self._attend_cuda(q, md, output_gate)

    def _attend_cuda(self, q: torch.Tensor, md: AttentionMetadata,
                     output_gate: torch.Tensor | None) -> torch.Tensor:
        # q, output_gate: [n, nq, hd], this step's K/V in the cache -> [n, nq * hd]
        from libvllm.kernels.decode_attention import paged_attention_decode
        from libvllm.kernels.paged_attention import paged_attention_prefill

        scales = {"k_scale": self.k_scale, "v_scale": self.v_scale}
        if md.max_query_len == 1 and md.seq_lens_t.shape[0] == q.shape[0]:  # a row per token
            short = 0 < md.max_seq_len <= NO_SPLIT_SEQ_LEN
            out = paged_attention_decode(q, self.kv_cache, md.block_table, md.seq_lens_t,
                                         self.scale, sliding_window=self.sliding_window,
                                         num_splits=1 if short else None,
                                         output_gate=output_gate, **scales)
        elif md.num_decodes:  # decode rows first, then the prefill rows
            out = torch.empty_like(q, memory_format=torch.contiguous_format)
            d, gate = md.num_decodes, output_gate
            if md.prefill_query_start_loc_t is None:
                md.prefill_query_start_loc_t = md.query_start_loc_t[d:] - d
            paged_attention_decode(q[:d], self.kv_cache, md.block_table[:d], md.seq_lens_t[:d],
                                   self.scale, out=out[:d], sliding_window=self.sliding_window,
                                   output_gate=None if gate is None else gate[:d], **scales)
            paged_attention_prefill(q[d:], self.kv_cache, md.prefill_query_start_loc_t,
                                    md.seq_lens_t[d:], md.block_table[d:], self.scale,
                                    out=out[d:], sliding_window=self.sliding_window,
                                    output_gate=None if gate is None else gate[d:], **scales)
        else:
            out = paged_attention_prefill(q, self.kv_cache, md.query_start_loc_t, md.seq_lens_t,
                                          md.block_table, self.scale,
                                          sliding_window=self.sliding_window,
                                          output_gate=output_gate, **scales)
        return out.view(q.shape[0], self.num_heads * self.head_size)


def reshape_and_cache(
    k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
) -> None:
    # k, v: [num_tokens, nkv, hd]; kv_cache: [2, num_blocks, block_size, nkv, hd];
    # an fp8 cache takes quantize_kv(k, k_scale), quantize_kv(v, v_scale) (as bytes)
    if kv_cache.dtype == FP8_KV_DTYPE:
        k, v = quantize_kv(k, k_scale).view(torch.uint8), quantize_kv(v, v_scale).view(
            torch.uint8)
        kv_cache = kv_cache.view(torch.uint8)
    # by block and offset: a hybrid model's cache is a strided view of the block pool;
    # padding rows (slot -1, vLLM's PAD_SLOT_ID) are not written
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    blocks, offsets = slots // kv_cache.shape[2], slots % kv_cache.shape[2]
    kv_cache[0, blocks, offsets] = k[keep].to(kv_cache.dtype)
    kv_cache[1, blocks, offsets] = v[keep].to(kv_cache.dtype)


def paged_attention_ref(
    q: torch.Tensor, kv_cache: torch.Tensor, md: AttentionMetadata, scale: float,
    sliding_window: int | None = None, k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    # q: [num_tokens, nq, hd] -> [num_tokens, nq, hd]; one SDPA call per request; an fp8
    # cache is read as dequantize_kv(kv, k_scale / v_scale, q.dtype)
    block_size = kv_cache.shape[2]
    out = torch.empty_like(q)
    for i, seq_len in enumerate(md.seq_lens):
        start, end = md.query_start_loc[i], md.query_start_loc[i + 1]
        q_len = end - start
        nblocks = (seq_len + block_size - 1) // block_size
        blocks = md.block_table[i, :nblocks].long()
        kc = kv_cache[0, blocks].flatten(0, 1)[:seq_len]  # [seq_len, nkv, hd]
        vc = kv_cache[1, blocks].flatten(0, 1)[:seq_len]
        # query j sits at absolute position seq_len - q_len + j and sees keys <= it
        qpos = torch.arange(seq_len - q_len, seq_len, device=q.device)
        kpos = torch.arange(seq_len, device=q.device)[None, :]
        mask = kpos <= qpos[:, None]  # [q_len, seq_len]
        if sliding_window is not None:
            mask &= kpos > qpos[:, None] - sliding_window
        if kv_cache.dtype == FP8_KV_DTYPE:
            kc, vc = dequantize_kv(kc, k_scale, q.dtype), dequantize_kv(vc, v_scale, q.dtype)
        group = q.shape[1] // kc.shape[1]  # GQA: each KV head serves `group` query heads
        kc = kc.transpose(0, 1).repeat_interleave(group, dim=0).to(q.dtype)  # [nq, seq, hd]
        vc = vc.transpose(0, 1).repeat_interleave(group, dim=0).to(q.dtype)
        o = F.scaled_dot_product_attention(q[start:end].transpose(0, 1), kc, vc, attn_mask=mask,
                                           scale=scale)  # [nq, q_len, hd]
        out[start:end] = o.transpose(0, 1)
    return out
