"""The model runner's Gated DeltaNet state: one slot per running request, as vLLM v1's
MambaManager in mamba_cache_mode "none" (vllm/v1/core/single_type_kv_cache_manager.py:
one state block per request) plus the state-index part of
vllm/v1/attention/backends/gdn_attn.py (GDNAttentionMetadataBuilder.build:
`has_initial_state = num_computed_tokens > 0`, state indices per request).

MambaStateCache allocates, per GDN layer, conv_state [slots, K-1, conv_dim] and ssm_state
[slots, Hv, dv, dk] (dtypes from engine/core/mamba_spec.py; fp32 SSM state where the
config says so) and binds them to the layers; slot 0 is the null slot (padding rows).
A request gets a zeroed slot when it is scheduled new (first time, or resumed after
preemption: recomputed from its first token) and gives it back when it finishes, is
aborted or is preempted. With prefix caching (vLLM's "align" mode, engine/core/mamba_align.py)
the pool also holds snapshot slots after the running ones: a request whose prefix hit
starts from a snapshot gets a copy of it, and after a step the states the scheduler asks
for (SchedulerOutput.mamba_saves) are copied into snapshots. A request that arrives with
computed tokens but no snapshot is an error (prefix caching without align mode).
setup_hybrid_prefix_caching wires align mode into a runner and its scheduler.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.core.mamba_align import MambaAlignCache
from engine.core.mamba_spec import gdn_state_dtypes, gdn_state_shapes
from engine.errors import InvalidArgumentError, OutOfResourcesError
from engine.layers.gdn import GatedDeltaNetAttention, GDNMetadata
from engine.worker.input_batch import CpuGpuBuffer

NULL_SLOT = 0


class MambaStateCache:
    def __init__(self, layers: list[GatedDeltaNetAttention], num_slots: int,
                 device: torch.device, conv_dtype: torch.dtype, ssm_dtype: torch.dtype,
                 conv_shape: tuple[int, ...], ssm_shape: tuple[int, ...],
                 num_snapshots: int = 0) -> None:
        self.device = device
        total = num_slots + 1 + num_snapshots  # null slot, running slots, snapshots
        for layer in layers:  # vLLM's bind_kv_cache for MambaBase layers
            layer.conv_state = torch.zeros(total, *conv_shape, dtype=conv_dtype, device=device)
            layer.ssm_state = torch.zeros(total, *ssm_shape, dtype=ssm_dtype, device=device)
        self.layers = layers
        # persistent per-row metadata (a decode CUDA graph reads these device buffers;
        # padding rows point at the null slot)
        self.state_indices = CpuGpuBuffer(num_slots, dtype=torch.long, device=device)
        self.has_initial_state = CpuGpuBuffer(num_slots, dtype=torch.bool, device=device)
        self.free_slots = list(range(num_slots, 0, -1))  # pop() hands out 1 first
        self.slot_of: dict[str, int] = {}

    @classmethod
    def for_model(cls, model: nn.Module, num_slots: int, device: torch.device,
                  num_snapshots: int = 0) -> MambaStateCache | None:
        """The state pool of a hybrid model (None for a model without GDN layers)."""
        layers = [m for m in model.modules() if isinstance(m, GatedDeltaNetAttention)]
        if not layers:
            return None
        cfg = model.config
        dtype = next(model.parameters()).dtype
        conv_dtype, ssm_dtype = gdn_state_dtypes(cfg, dtype)
        conv_shape, ssm_shape = gdn_state_shapes(cfg)
        return cls(layers, num_slots, device, conv_dtype, ssm_dtype, conv_shape, ssm_shape,
                   num_snapshots)

    def add(self, req_id: str, num_computed_tokens: int, restore_slot: int | None = None
            ) -> None:
        """A slot for a request scheduled new: zeroed, or a copy of the snapshot its
        prefix hit starts from."""
        if num_computed_tokens and restore_slot is None:
            raise InvalidArgumentError(
                f"request {req_id!r} starts at token {num_computed_tokens} without a saved "
                "Gated DeltaNet state: prefix caching of hybrid models needs align mode "
                "(setup_hybrid_prefix_caching), else enable_prefix_caching off")
        self.free(req_id)
        if not self.free_slots:
            raise OutOfResourcesError("no free Gated DeltaNet state slot (more running "
                                      "requests than max_num_seqs)")
        slot = self.slot_of[req_id] = self.free_slots.pop()
        for layer in self.layers:
            if num_computed_tokens:
                layer.conv_state[slot].copy_(layer.conv_state[restore_slot])
                layer.ssm_state[slot].copy_(layer.ssm_state[restore_slot])
            else:
                layer.conv_state[slot].zero_()
                layer.ssm_state[slot].zero_()

    def save(self, saves: list[tuple[str, int]]) -> None:
        """Copy the listed requests' states into their snapshot slots (after a step)."""
        src = torch.tensor([self.slot_of[r] for r, _ in saves], device=self.device)
        dst = torch.tensor([s for _, s in saves], device=self.device)
        for layer in self.layers:
            layer.conv_state[dst] = layer.conv_state[src]
            layer.ssm_state[dst] = layer.ssm_state[src]

    def free(self, req_id: str) -> None:
        slot = self.slot_of.pop(req_id, None)
        if slot is not None:
            self.free_slots.append(slot)

    def build_metadata(self, req_ids: list[str], num_computed: list[int],
                       query_start_loc: list[int], max_query_len: int,
                       query_start_loc_t: torch.Tensor, rows: int | None = None
                       ) -> GDNMetadata:
        """This step's GDN metadata (decode rows and prefill chunks alike) over `rows`
        rows (a padded decode graph's size; the rows past the requests are padding).
        query_start_loc_t is the runner's device copy ([rows + 1] int32)."""
        n = len(req_ids)
        rows = rows or n
        slots = [self.slot_of[r] for r in req_ids]
        init = [c > 0 for c in num_computed]
        self.state_indices.np[:n] = slots
        self.state_indices.np[n:rows] = NULL_SLOT
        self.has_initial_state.np[:n] = init
        self.has_initial_state.np[n:rows] = False
        return GDNMetadata(query_start_loc, slots, init, max_query_len, query_start_loc_t,
                           self.state_indices.copy_to_gpu(rows),
                           self.has_initial_state.copy_to_gpu(rows))


def setup_hybrid_prefix_caching(runner, scheduler, block_size: int,
                                num_snapshots: int | None = None) -> None:
    """Align-mode prefix caching for a hybrid model (nothing otherwise): the runner's
    pool grows num_snapshots (default max_num_reqs) snapshot slots, handed out by the
    scheduler's MambaAlignCache. Call after the runner's KV cache is bound, before the
    CUDA graphs are captured (they read the pool's tensors) and before any request; a
    second call does nothing (the engine core makes the first)."""
    if runner.mamba is None or not scheduler.kv_cache_manager.enable_caching \
            or getattr(scheduler, "mamba_align", None) is not None:
        return
    if runner.cudagraphs is not None:
        raise RuntimeError("setup_hybrid_prefix_caching must run before capture_model")
    n = runner.max_num_reqs
    snaps = num_snapshots or n
    for layer in runner.mamba.layers:  # the old pool goes before the new one is allocated
        layer.conv_state = layer.ssm_state = None
    runner.mamba = MambaStateCache.for_model(runner.model, n, runner.device,
                                             num_snapshots=snaps)
    scheduler.mamba_align = MambaAlignCache(block_size, first_slot=n + 1, num_slots=snaps)
