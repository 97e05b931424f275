"""The hybrid cache on the runner's side: one memory pool for attention KV and Gated
DeltaNet state, as vllm/v1/worker/gpu_model_runner.py (_reshape_kv_cache_tensors and the
hybrid attention layout: one raw buffer per layer slot, shared by one layer of every KV
cache group, viewed as KV blocks by attention layers and as (conv, ssm) state by GDN
layers; state index = block id) plus the state-index part of
vllm/v1/attention/backends/gdn_attn.py (GDNAttentionMetadataBuilder.build, one metadata
per GDN group: `has_initial_state = num_computed_tokens > 0`).

hybrid_kv_cache_config turns a model config into the unified specs and layer groups
(engine/core/kv_cache_interface.py); allocate_hybrid_kv_cache makes the buffers
[num_blocks * page] int8; MambaStateCache binds the views and keeps each running
request's state block per group (the scheduler's MambaManager hands them out). Buffer
t, block b: attention layer t of the group sees K then V of block b ([num_blocks, 2, ...]
presented as [2, num_blocks, block_size, nkv, hd] with strides), GDN layer t of group j
sees conv_state then ssm_state at the page's start ([num_blocks, K-1, conv_dim] and
[num_blocks, Hv, dv, dk], block stride one page). A request's state blocks are zeroed
when it is scheduled new (first time, or resumed after preemption: recomputed), or start
as a copy of the saved state blocks its prefix hit names (align mode), batched per step
before the forward pass (build_metadata); after a step the
states the scheduler asks for (SchedulerOutput.mamba_saves) are copied into blocks that
become cached. Block 0 is the pool's null block: padding rows' state index.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from libvllm.engine.core.kv_cache_interface import (
    FullAttentionSpec,
    HybridKVCacheConfig,
    MambaSpec,
    gated_delta_net_state_dtype,
    gated_delta_net_state_shape,
    unify_hybrid_specs,
)
from libvllm.engine.core.kv_cache_utils import group_hybrid_layers
from libvllm.engine.errors import InvalidArgumentError, ModelLoadError
from libvllm.engine.layers.gdn import (
    GatedDeltaNetAttention,
    GDNMetadata,
    GDNStepRef,
    dummy_gdn_metadata,
)
from libvllm.engine.models.config import ModelArchConfig
from libvllm.engine.sample.ops.torch_utils import async_tensor_h2d
from libvllm.engine.worker.input_batch import CpuGpuBuffer

NULL_BLOCK = 0


def capture_lens(num_tokens: int) -> list[int]:
    """The rows a breakable graph of num_tokens tokens runs its GDN core on while it is
    captured: a decode row and a prefill row of the rest (from 3 tokens), so the capture
    passes reach the mixed steps' kernel variants (conv time blocks of every width up to
    64, the recurrent kernel alone and after the chunked ones)."""
    return [num_tokens] if num_tokens < 3 else [1, num_tokens - 1]


def profile_lens(num_tokens: int, max_num_reqs: int) -> list[int]:
    """vLLM's _dummy_run batch: num_tokens split evenly over min(num_tokens, max_num_reqs)
    rows, the remainder on the last."""
    rows = max(1, min(num_tokens, max_num_reqs))
    lens = [num_tokens // rows] * rows
    lens[-1] += num_tokens % rows
    return lens


@contextlib.contextmanager
def profile_gdn_core(model: nn.Module, num_tokens: int, max_num_reqs: int,
                     device: torch.device) -> Iterator[None]:
    """Inside, a forward without metadata (the memory profile) runs every GDN layer's
    core on profile_lens rows through the chunked kernels (vLLM's "triton" prefill
    backend: each row of more than one token is chunked), so the profile's peak holds
    the core's temporaries at the full chunk, which vLLM's profile run skips: conv
    output, gates, w, u, output and the per-chunk solve scratch ([chunks, Hv, 64, 64]
    fp32). Qwen3.5-35B-A3B's layer at 16,384 tokens over 1,024 rows: 1,024 chunks (a step
    of auto's chunked path has at most tokens / 64 + its prefill rows), ~1.1 GiB; one
    16,384-token row would count ~0.75 GiB. Rows share one state slot: the layers' state
    before the KV cache exists is one scratch slot (fp32 recurrent state), its contents
    never read."""
    layers = [m for m in model.modules() if isinstance(m, GatedDeltaNetAttention)]
    if not layers or num_tokens < 1:
        yield
        return
    md = dummy_gdn_metadata(profile_lens(num_tokens, max_num_reqs), device, NULL_BLOCK,
                            "triton")
    unbound = [layer for layer in layers if layer.conv_state is None]
    if unbound:
        ref = unbound[0]
        conv = torch.zeros(1, ref.conv_kernel_size - 1, ref.conv_dim,
                           dtype=ref.conv1d.weight.dtype, device=device)
        ssm = torch.zeros(1, ref.num_v_heads, ref.head_v_dim, ref.head_k_dim,
                          dtype=torch.float32, device=device)
    for layer in unbound:
        layer.conv_state, layer.ssm_state = conv, ssm
    for layer in layers:
        layer.profile_metadata = md
    try:
        yield
    finally:
        for layer in layers:
            layer.profile_metadata = None
        for layer in unbound:
            layer.conv_state = layer.ssm_state = None


def num_gdn_layers(cfg: ModelArchConfig) -> int:
    return sum(t == "linear_attention" for t in cfg.layer_types or ())


def num_attention_layers(cfg: ModelArchConfig) -> int:
    """Layers that hold a paged KV cache (all layers for a non-hybrid model)."""
    return cfg.num_hidden_layers - num_gdn_layers(cfg)


def gdn_mamba_spec(cfg: ModelArchConfig, model_dtype: torch.dtype,
                   mamba_cache_dtype: str = "auto", mamba_ssm_cache_dtype: str = "auto",
                   mamba_cache_mode: str = "none", block_size: int = -1) -> MambaSpec:
    """The GDN state spec; an "auto" SSM dtype takes the config's mamba_ssm_dtype first
    (Qwen3.5/3.6: float32), as vLLM's Qwen3.5 config update does."""
    if mamba_ssm_cache_dtype == "auto" and cfg.mamba_ssm_dtype:
        mamba_ssm_cache_dtype = cfg.mamba_ssm_dtype
    shapes = gated_delta_net_state_shape(
        cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
        cfg.linear_value_head_dim, cfg.linear_conv_kernel_dim)
    dtypes = gated_delta_net_state_dtype(model_dtype, mamba_cache_dtype, mamba_ssm_cache_dtype)
    return MambaSpec(shapes, dtypes, block_size, mamba_cache_mode=mamba_cache_mode)


def hybrid_kv_cache_config(cfg: ModelArchConfig, model_dtype: torch.dtype, block_size: int,
                           num_blocks: int = 0, kv_dtype: torch.dtype | None = None,
                           mamba_cache_dtype: str = "auto",
                           mamba_ssm_cache_dtype: str = "auto",
                           mamba_cache_mode: str = "none",
                           max_model_len: int = -1) -> HybridKVCacheConfig:
    """The unified specs and groups of a hybrid model (num_blocks filled in later)."""
    attn_layers, gdn_layers = num_attention_layers(cfg), num_gdn_layers(cfg)
    attn = FullAttentionSpec(block_size, cfg.num_key_value_heads, cfg.head_dim,
                             kv_dtype or model_dtype)
    mamba = gdn_mamba_spec(cfg, model_dtype, mamba_cache_dtype, mamba_ssm_cache_dtype,
                           mamba_cache_mode)
    attn, mamba = unify_hybrid_specs(attn, mamba)
    mamba = MambaSpec(mamba.shapes, mamba.dtypes,  # vLLM's mamba_block_size
                      attn.block_size if mamba_cache_mode == "align" else max_model_len,
                      mamba.page_size_padded, mamba_cache_mode)
    attn_groups, mamba_groups = group_hybrid_layers(attn_layers, gdn_layers)
    if len(attn_groups) != 1:
        raise ModelLoadError(f"a hybrid model with {attn_layers} attention and {gdn_layers} "
                             "Gated DeltaNet layers (more attention than GDN layers) is not "
                             "supported")
    return HybridKVCacheConfig(num_blocks, attn, mamba, attn_groups, mamba_groups)


def allocate_hybrid_kv_cache(kv_config: HybridKVCacheConfig, device: torch.device
                             ) -> list[torch.Tensor]:
    """group_size buffers [num_blocks * page] int8 (zeroed, as vLLM's allocate_kv_cache)."""
    size = kv_config.num_blocks * kv_config.page_size_bytes
    return [torch.zeros(size, dtype=torch.int8, device=device)
            for _ in range(kv_config.group_size)]


def attention_view(buf: torch.Tensor, spec: FullAttentionSpec, num_blocks: int
                   ) -> torch.Tensor:
    """[2, num_blocks, block_size, nkv, hd] over [num_blocks, 2, block_size, nkv, hd]."""
    half = spec.block_size * spec.num_kv_heads * spec.head_size  # elements of K of a block
    return buf.view(spec.dtype).as_strided(
        (2, num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size),
        (half, 2 * half, spec.num_kv_heads * spec.head_size, spec.head_size, 1))


def state_views(buf: torch.Tensor, spec: MambaSpec, num_blocks: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(conv_state [num_blocks, K-1, conv_dim], ssm_state [num_blocks, Hv, dv, dk]), one
    page apart; the SSM state starts right after the conv state."""
    (conv_shape, ssm_shape), (conv_dtype, ssm_dtype) = spec.shapes, spec.dtypes
    page = spec.page_size_bytes
    conv_bytes = conv_shape[0] * conv_shape[1] * conv_dtype.itemsize
    assert page % ssm_dtype.itemsize == 0 and conv_bytes % ssm_dtype.itemsize == 0
    conv = buf.view(conv_dtype).as_strided(
        (num_blocks, *conv_shape), (page // conv_dtype.itemsize, conv_shape[1], 1))
    hv, dv, dk = ssm_shape
    ssm = buf.view(ssm_dtype).as_strided(
        (num_blocks, hv, dv, dk), (page // ssm_dtype.itemsize, dv * dk, dk, 1),
        conv_bytes // ssm_dtype.itemsize)
    return conv, ssm


class MambaStateCache:
    def __init__(self, groups: list[list[GatedDeltaNetAttention]], max_num_reqs: int,
                 device: torch.device) -> None:
        self.device = device
        self.groups = groups  # the GDN layers of each KV cache group
        self.layers = [layer for group in groups for layer in group]
        # persistent per-row metadata (a decode CUDA graph reads these device buffers;
        # padding rows point at the null block)
        self.state_indices = [CpuGpuBuffer(max_num_reqs, dtype=torch.long, device=device)
                              for _ in groups]
        self.has_initial_state = CpuGpuBuffer(max_num_reqs, dtype=torch.bool, device=device)
        self.blocks_of: dict[str, list[int]] = {}  # req_id -> its state block per group
        # where a breakable (mixed) graph's GDN layers read their step's metadata: the
        # model runner sets it before each replay
        self.step_ref = GDNStepRef()
        # new requests' state blocks to zero / (saved blocks, own blocks) to copy
        self._pending_zeros: list[list[int]] = []
        self._pending_copies: list[tuple[list[int], list[int]]] = []

    @classmethod
    def bind(cls, model: nn.Module, buffers: list[torch.Tensor],
             kv_config: HybridKVCacheConfig, max_num_reqs: int, device: torch.device
             ) -> tuple[MambaStateCache, list[torch.Tensor]]:
        """Bind the GDN layers' state views (vLLM's bind_kv_cache); -> (the cache, the KV
        view of each attention layer in model order)."""
        gdn = [m for m in model.modules() if isinstance(m, GatedDeltaNetAttention)]
        n = kv_config.num_blocks
        groups = []
        for j, group in enumerate(kv_config.mamba_groups):
            groups.append([])
            for t, i in enumerate(group):
                if i < 0:
                    continue
                gdn[i].conv_state, gdn[i].ssm_state = state_views(
                    buffers[t], kv_config.mamba_spec, n)
                gdn[i].state_group = j
                groups[-1].append(gdn[i])
        attn_index = kv_config.attn_groups[0]
        kv = [attention_view(buffers[attn_index.index(i)], kv_config.attn_spec, n)
              for i in range(sum(i >= 0 for i in attn_index))]
        return cls(groups, max_num_reqs, device), kv

    def add(self, req_id: str, state_block_ids: list[int], num_computed_tokens: int,
            restore_block_ids: list[int] | None = None) -> None:
        """A request scheduled new: its state blocks are zeroed, or start as copies of the
        saved state blocks its prefix hit names (done with the step's next metadata)."""
        if num_computed_tokens and restore_block_ids is None:
            raise InvalidArgumentError(
                f"request {req_id!r} starts at token {num_computed_tokens} without a saved "
                "Gated DeltaNet state: prefix caching of hybrid models needs "
                "mamba_cache_mode align")
        self.blocks_of[req_id] = state_block_ids
        if num_computed_tokens:
            self._pending_copies.append((restore_block_ids, state_block_ids))
        else:
            self._pending_zeros.append(state_block_ids)

    def _init_new_states(self) -> None:
        """The new requests' state blocks, zeroed or copied: one indexed op per layer and
        tensor (pinned, non-blocking index copies: no host sync)."""
        for j, group in enumerate(self.groups):
            if self._pending_zeros:
                idx = async_tensor_h2d([b[j] for b in self._pending_zeros], torch.long,
                                       self.device)
                for layer in group:
                    layer.conv_state[idx] = 0
                    layer.ssm_state[idx] = 0
            if self._pending_copies:
                self._copy(group, [s[j] for s, _ in self._pending_copies],
                           [d[j] for _, d in self._pending_copies])
        self._pending_zeros, self._pending_copies = [], []

    def _copy(self, group: list[GatedDeltaNetAttention], src: list[int], dst: list[int]
              ) -> None:
        src_t = async_tensor_h2d(src, torch.long, self.device)
        dst_t = async_tensor_h2d(dst, torch.long, self.device)
        for layer in group:
            layer.conv_state[dst_t] = layer.conv_state[src_t]
            layer.ssm_state[dst_t] = layer.ssm_state[src_t]

    def save(self, saves: list[tuple[str, list[int]]]) -> None:
        """Copy the listed requests' states into the named blocks (after a step)."""
        for j, group in enumerate(self.groups):
            self._copy(group, [self.blocks_of[r][j] for r, _ in saves],
                       [blocks[j] for _, blocks in saves])

    def free(self, req_id: str) -> None:
        self.blocks_of.pop(req_id, None)

    def capture_metadata(self, num_tokens: int) -> list[GDNMetadata]:
        """The GDN metadata a breakable graph's eager core runs on while the graph of
        num_tokens tokens is captured: capture_lens rows on the null block."""
        md = dummy_gdn_metadata(capture_lens(num_tokens), self.device, NULL_BLOCK)
        return [md] * len(self.groups)

    def graph_metadata(self, rows: int, query_start_loc_t: torch.Tensor
                       ) -> list[GDNMetadata]:
        """A captured decode graph's GDN metadata: the persistent device buffers themselves,
        which each step's build_metadata fills before the replay. A copy captured inside
        the graph would re-read its pinned host source when the replay runs, after the
        next step's inputs may have overwritten it (async scheduling)."""
        init_t = self.has_initial_state.gpu[:rows]
        return [GDNMetadata([], [], [], 1, query_start_loc_t, buf.gpu[:rows], init_t)
                for buf in self.state_indices]

    def reset_graph_buffers(self) -> None:
        """Padding values (the null block, no initial state) for the rows a graph reads,
        set once before capture, outside any graph."""
        for buf in self.state_indices:
            buf.gpu.fill_(NULL_BLOCK)
        self.has_initial_state.gpu.zero_()

    def build_metadata(self, req_ids: list[str], num_computed: list[int],
                       query_start_loc: list[int], max_query_len: int,
                       query_start_loc_t: torch.Tensor, rows: int | None = None
                       ) -> list[GDNMetadata]:
        """This step's GDN metadata per group (decode rows and prefill chunks alike) over
        `rows` rows (a padded decode graph's size; the rows past the requests are
        padding). query_start_loc_t is the runner's device copy ([rows + 1] int32). The
        states of requests added since the last call are initialised first."""
        self._init_new_states()
        n = len(req_ids)
        rows = rows or n
        init = [c > 0 for c in num_computed]
        self.has_initial_state.np[:n] = init
        self.has_initial_state.np[n:rows] = False
        init_t = self.has_initial_state.copy_to_gpu(rows)
        out = []
        for j, buf in enumerate(self.state_indices):
            blocks = [self.blocks_of[r][j] for r in req_ids]
            buf.np[:n] = blocks
            buf.np[n:rows] = NULL_BLOCK
            out.append(GDNMetadata(query_start_loc, blocks, init, max_query_len,
                                   query_start_loc_t, buf.copy_to_gpu(rows), init_t))
        return out
