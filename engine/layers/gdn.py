"""Gated DeltaNet linear attention of Qwen3-Next / Qwen3.5 / Qwen3.6, with its per-request state.

Mirrors vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py
(QwenGatedDeltaNetAttention: in-projections, causal conv1d over cat(q, k, v) with its conv
state, gates g = -exp(A_log) * softplus(a + dt_bias) and beta = sigmoid(b), the gated delta
rule with L2-normed q/k and grouped value heads, RMSNormGated(norm before a SiLU gate z),
out_proj) and vllm/v1/attention/backends/gdn_attn.py (GDNAttentionMetadata: per-request
state slots, whether a request continues from a state, query start locations).

In-projection layouts: all load into one flat projection `in_proj`, rows
[q | k | v | z | b | a] (all heads; vLLM's in_proj_qkvz and in_proj_ba stacked, so a decode
step runs one GEMV for both). Qwen3.5 checkpoints give those parts as separate tensors
(in_proj_qkv, in_proj_z, in_proj_b, in_proj_a: shards, as vLLM's stacked mapping);
Qwen3-Next checkpoints give in_proj_qkvz and in_proj_ba interleaved per key-head group
([q_g, k_g, v_g, z_g] and [b_g, a_g]), undone at load time (vLLM's
fix_query_key_value_ordering, done once).

State (bound by engine/worker/mamba_utils.py): conv_state [num_blocks, K-1, conv_dim]
(vLLM's "SD" layout) and ssm_state [num_blocks, Hv, dv, dk], strided views of the block
pool shared with the attention KV (one page per block); the state index of a request is
its state block in this layer's KV cache group (`state_group`, the metadata md.gdn holds
one GDNMetadata per group); block 0 is the null block. In a breakable graph (a hybrid's
mixed step, engine/worker/cudagraph_runner.py) md.gdn holds a GDNStepRef instead: the
core is an eager break (engine/breakable_cudagraph.py, vLLM's qwen_gdn_attention_core
splitting op) that runs on the step's metadata, read from the reference when it runs,
over the step's own tokens, into a zeroed output the graph allocated. In the memory
profile (no metadata) the core runs on `profile_metadata` when the runner sets it. CUDA
runs the Triton kernels (kernels/causal_conv1d.py, kernels/gated_delta_rule.py), the CPU
their torch references. Prefill rows (more than one token) on CUDA run the chunked kernels of
kernels/chunk_gated_delta_rule.py when GDN_PREFILL_BACKEND is "triton" (vLLM's
--gdn-prefill-backend triton: FLA's chunk_gated_delta_rule), decode rows the recurrent
kernel; "recurrent" runs every row recurrently. "auto" (the default; vLLM's auto always
takes a chunked kernel on CUDA) takes the chunked kernels when the step's longest row has
at least one chunk (CHUNK_SIZE tokens), else the recurrent one, whose time follows the
longest row: on the H200 the chunked kernels are 6.4x faster on one 1024-token prompt,
2.3x on 64 x 128, 0.6x on 256 x 16 (examples/bench/gdn_prefill.py, docs/hybrid-gdn.md).
Set it with the environment variable LIBVLLM_GDN_PREFILL_BACKEND.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from libvllm.engine import envs
from libvllm.engine.breakable_cudagraph import eager_break
from libvllm.engine.errors import InvalidArgumentError, ModelLoadError
from libvllm.engine.layers.attention import use_kernels
from libvllm.engine.layers.linear import MergedReplicatedLinear, RowParallelLinear
from libvllm.engine.sample.ops.torch_utils import async_tensor_h2d
from libvllm.kernels.causal_conv1d import causal_conv1d_fn, causal_conv1d_ref
from libvllm.kernels.chunk_gated_delta_rule import (
    CHUNK_SIZE,
    chunk_sigmoid_gating_delta_rule,
    prepare_chunk_indices,
)
from libvllm.kernels.gated_delta_rule import (
    fused_sigmoid_gating_delta_rule,
    gated_delta_rule_varlen_torch,
)
from libvllm.kernels.rms_norm_gated import rms_norm_gated, rms_norm_gated_ref

GDN_PREFILL_BACKENDS = ("auto", "recurrent", "triton")
GDN_PREFILL_BACKEND = envs.LIBVLLM_GDN_PREFILL_BACKEND


@dataclass
class GDNMetadata:
    """One step's view of the GDN state (vLLM's GDNAttentionMetadata, non-spec part)."""

    query_start_loc: list[int]  # [num_reqs + 1] host
    state_indices: list[int]  # [num_reqs] host: each request's state block
    has_initial_state: list[bool]  # [num_reqs] host: continues from its state
    max_query_len: int
    # device copies (the Triton kernels read these)
    query_start_loc_t: torch.Tensor  # [num_reqs + 1] int32
    state_indices_t: torch.Tensor  # [num_reqs] int64
    has_initial_state_t: torch.Tensor  # [num_reqs] bool
    prefill_backend: str | None = None  # None: GDN_PREFILL_BACKEND

    @functools.cached_property
    def chunked_prefill(self) -> bool:
        """Whether this step's prefill rows run the chunked kernels (GDN_PREFILL_BACKEND)."""
        backend = self.prefill_backend or GDN_PREFILL_BACKEND
        if self.max_query_len <= 1 or backend == "recurrent":
            return False
        return backend == "triton" or self.max_query_len >= CHUNK_SIZE

    @functools.cached_property
    def prefill_split(self) -> GDNPrefillSplit:
        """The rows split between the chunked (prefill) and recurrent (decode) kernels,
        built once per step on the host (vLLM's num_prefills / num_decodes split)."""
        rows = self.state_indices_t.shape[0]  # past the requests: padding (no tokens)
        qsl = self.query_start_loc
        pre = [qsl[i + 1] - qsl[i] > 1 for i in range(len(self.state_indices))]
        prefill = [s if p else -1 for s, p in zip(self.state_indices, pre)]
        decode = [-1 if p else s for s, p in zip(self.state_indices, pre)]
        pad = [-1] * (rows - len(prefill))
        dev, dtype = self.state_indices_t.device, self.state_indices_t.dtype
        chunks = prepare_chunk_indices(qsl, prefill)
        return GDNPrefillSplit(  # pinned, non-blocking copies: no host sync in the forward
            async_tensor_h2d(prefill + pad, dtype, dev),
            None if all(pre) else async_tensor_h2d(decode + pad, dtype, dev),
            async_tensor_h2d(chunks, torch.int32, dev).view(-1, 2))


@dataclass
class GDNPrefillSplit:
    """State indices per kernel (-1: the row belongs to the other one) and the chunks."""

    prefill_state_indices_t: torch.Tensor  # [rows]: rows of more than one token
    decode_state_indices_t: torch.Tensor | None  # [rows]: one-token rows; None: none
    chunk_indices_t: torch.Tensor  # [num_chunks, 2] int32 (sequence, chunk)


def dummy_gdn_metadata(lens: list[int], device: torch.device, state_index: int = 0,
                       prefill_backend: str | None = None) -> GDNMetadata:
    """Metadata of rows of `lens` tokens, every one on state block `state_index` with no
    initial state: the batches a capture or the memory profile runs the GDN core on
    (their state writes land in that one block: the pool's null block, or the profile's
    scratch slot, whose contents nothing reads)."""
    qsl = [0]
    for n in lens:
        qsl.append(qsl[-1] + n)
    n = len(lens)
    idx, init = [state_index] * n, [False] * n
    return GDNMetadata(qsl, idx, init, max(lens), async_tensor_h2d(qsl, torch.int32, device),
                       async_tensor_h2d(idx, torch.long, device),
                       async_tensor_h2d(init, torch.bool, device), prefill_backend)


class GDNStepRef:
    """The GDN metadata of the step a breakable graph replays (per KV cache group),
    set by the model runner before the replay and read by the layers' eager core
    (vLLM's forward context, read by qwen_gdn_attention_core)."""

    def __init__(self) -> None:
        self.metadata: list[GDNMetadata] | None = None


class RMSNormGated(nn.Module):
    """rmsnorm(x) * w * silu(z), per value head; w is plain (init 1), not zero-centred."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        # x, z: [n, Hv, dv] (z a strided view) -> [n, Hv * dv] in x's dtype (fp32 statistics)
        if use_kernels(x):  # one Triton launch (vLLM's RMSNormGated.forward_cuda)
            return rms_norm_gated(x, z, self.weight, self.variance_epsilon)
        return rms_norm_gated_ref(x, z, self.weight, self.variance_epsilon).flatten(-2)


# (param fragment, checkpoint fragment, expert id, shard id): models/utils.load_weights
GDN_PARAMS_MAPPING = [
    ("in_proj.", "in_proj_qkv.", None, "qkv"),
    ("in_proj.", "in_proj_z.", None, "z"),
    ("in_proj.", "in_proj_b.", None, "b"),
    ("in_proj.", "in_proj_a.", None, "a"),
    ("in_proj.", "in_proj_qkvz.", None, "qkvz"),
    ("in_proj.", "in_proj_ba.", None, "ba"),
]


class GatedDeltaNetAttention(nn.Module):
    def __init__(self, hidden_size: int, num_k_heads: int, num_v_heads: int, head_k_dim: int,
                 head_v_dim: int, conv_kernel_size: int, rms_norm_eps: float) -> None:
        super().__init__()
        if GDN_PREFILL_BACKEND not in GDN_PREFILL_BACKENDS:
            raise InvalidArgumentError(f"LIBVLLM_GDN_PREFILL_BACKEND={GDN_PREFILL_BACKEND!r}: "
                                       f"expected one of {GDN_PREFILL_BACKENDS}")
        if num_v_heads % num_k_heads:
            raise ModelLoadError(f"linear_num_value_heads={num_v_heads} is not a multiple of "
                                 f"linear_num_key_heads={num_k_heads}")
        self.num_k_heads, self.num_v_heads = num_k_heads, num_v_heads
        self.head_k_dim, self.head_v_dim = head_k_dim, head_v_dim
        self.key_dim, self.value_dim = num_k_heads * head_k_dim, num_v_heads * head_v_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.conv_kernel_size = conv_kernel_size
        # vLLM's in_proj_qkvz and in_proj_ba as one projection: one GEMV a layer, not two
        self.in_proj = MergedReplicatedLinear(
            hidden_size, {"qkv": self.conv_dim, "z": self.value_dim, "b": num_v_heads,
                          "a": num_v_heads},
            {"qkvz": (("qkv", "z"), self._qkvz_from_grouped),
             "ba": (("b", "a"), self._ba_from_grouped)})
        self.conv1d = nn.Module()
        self.conv1d.weight = nn.Parameter(torch.empty(self.conv_dim, 1, conv_kernel_size),
                                          requires_grad=False)
        self.A_log = nn.Parameter(torch.empty(num_v_heads), requires_grad=False)
        self.dt_bias = nn.Parameter(torch.ones(num_v_heads), requires_grad=False)
        self.norm = RMSNormGated(head_v_dim, rms_norm_eps)
        self.out_proj = RowParallelLinear(self.value_dim, hidden_size)
        # bound by engine/worker/mamba_utils.py: [num_blocks, K-1, conv_dim],
        # [num_blocks, Hv, dv, dk] (block stride: one page), and its KV cache group
        self.conv_state: torch.Tensor | None = None
        self.ssm_state: torch.Tensor | None = None
        self.state_group = 0
        # the memory profile's metadata (engine/worker/mamba_utils.py profile_gdn_core):
        # a forward without metadata runs the core on it; None: the core is skipped
        self.profile_metadata: GDNMetadata | None = None

    def _qkvz_from_grouped(self, w: torch.Tensor) -> torch.Tensor:
        # Qwen3-Next rows per key head g: [q_g, k_g, v_g (r*dv), z_g (r*dv)] -> [Q | K | V | Z]
        r = self.num_v_heads // self.num_k_heads
        dk, dv = self.head_k_dim, self.head_v_dim
        g = w.view(self.num_k_heads, 2 * dk + 2 * r * dv, -1)
        q, k, v, z = g.split([dk, dk, r * dv, r * dv], dim=1)
        return torch.cat([x.reshape(-1, w.shape[1]) for x in (q, k, v, z)])

    def _ba_from_grouped(self, w: torch.Tensor) -> torch.Tensor:
        # Qwen3-Next rows per key head g: [b_g (r), a_g (r)] -> [B | A]
        r = self.num_v_heads // self.num_k_heads
        b, a = w.view(self.num_k_heads, 2 * r, -1).split([r, r], dim=1)
        return torch.cat([b.reshape(-1, w.shape[1]), a.reshape(-1, w.shape[1])])

    def forward(self, hidden_states: torch.Tensor, md) -> torch.Tensor:
        # hidden_states: [n, hidden] -> [n, hidden]
        n = hidden_states.shape[0]
        # strided views of one [n, conv_dim + value_dim + 2 Hv] output: the kernels take strides
        mixed_qkv, z, b, a = self.in_proj(hidden_states).split(
            [self.conv_dim, self.value_dim, self.num_v_heads, self.num_v_heads], dim=-1)
        gdn: GDNMetadata | GDNStepRef | None = self.profile_metadata \
            if md is None or md.gdn is None else md.gdn[self.state_group]
        if gdn is None:  # profile run without a profiled core: activations only
            core = hidden_states.new_zeros(n, self.num_v_heads, self.head_v_dim)
        elif isinstance(gdn, GDNStepRef):  # a breakable graph: the core runs eagerly
            core = hidden_states.new_zeros(n, self.num_v_heads, self.head_v_dim)
            eager_break(self._core_into, mixed_qkv, b, a, core, gdn)
        else:
            core = self._forward_core(mixed_qkv, b, a, gdn)
        core = self.norm(core, z.view(n, self.num_v_heads, self.head_v_dim))  # [n, value_dim]
        return self.out_proj(core)

    def _core_into(self, mixed_qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor,
                   core: torch.Tensor, ref: GDNStepRef) -> None:
        """The eager break of a breakable graph: the core over the step's real tokens
        (the rows of its metadata: the graph's padding tokens stay 0), written into
        `core` [n_padded, Hv, dv]. Without metadata (none set) it leaves `core` as is."""
        if ref.metadata is None:
            return
        gdn = ref.metadata[self.state_group]
        t = gdn.query_start_loc[-1]
        core[:t].copy_(self._forward_core(mixed_qkv[:t], b[:t], a[:t], gdn))

    def _forward_core(self, mixed_qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor,
                      gdn: GDNMetadata) -> torch.Tensor:
        # mixed_qkv: [n, conv_dim]; b, a: [n, Hv] -> core output [n, Hv, dv]
        n = mixed_qkv.shape[0]
        w = self.conv1d.weight[:, 0]  # [conv_dim, K]
        if use_kernels(mixed_qkv):
            x = causal_conv1d_fn(mixed_qkv, w, self.conv_state, gdn.query_start_loc_t,
                                 gdn.state_indices_t, gdn.has_initial_state_t,
                                 gdn.max_query_len)
        else:
            x = causal_conv1d_ref(mixed_qkv, w, self.conv_state, gdn.query_start_loc,
                                  gdn.state_indices, gdn.has_initial_state)
        q, k, v = x.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = q.unflatten(-1, (self.num_k_heads, self.head_k_dim))
        k = k.unflatten(-1, (self.num_k_heads, self.head_k_dim))
        v = v.unflatten(-1, (self.num_v_heads, self.head_v_dim))
        if use_kernels(mixed_qkv) and gdn.chunked_prefill:
            split = gdn.prefill_split  # chunked rows first: they zero the rest of `out`
            out = chunk_sigmoid_gating_delta_rule(
                q, k, v, a, b, self.A_log, self.dt_bias, self.ssm_state, gdn.query_start_loc_t,
                split.prefill_state_indices_t, gdn.has_initial_state_t, split.chunk_indices_t)
            if split.decode_state_indices_t is None:
                return out
            return fused_sigmoid_gating_delta_rule(
                q, k, v, a, b, self.A_log, self.dt_bias, self.ssm_state, gdn.query_start_loc_t,
                split.decode_state_indices_t, gdn.has_initial_state_t, out)
        if use_kernels(mixed_qkv):  # gates computed in the kernel
            return fused_sigmoid_gating_delta_rule(
                q, k, v, a, b, self.A_log, self.dt_bias, self.ssm_state, gdn.query_start_loc_t,
                gdn.state_indices_t, gdn.has_initial_state_t)
        beta = b.sigmoid()
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())  # [n, Hv]
        assert n == gdn.query_start_loc[-1], "GDN metadata does not cover the batch"
        return gated_delta_rule_varlen_torch(q, k, v, g, beta, self.ssm_state,
                                             gdn.query_start_loc, gdn.state_indices,
                                             gdn.has_initial_state)
