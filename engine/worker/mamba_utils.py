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
aborted or is preempted. A new request that arrives with computed tokens (a prefix-cache
hit) has no state to continue from: an error, since prefix caching of hybrid models
(vLLM's "align" mode) is not implemented; the engine must run them with it off.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.core.mamba_spec import gdn_state_dtypes, gdn_state_shapes
from engine.errors import InvalidArgumentError, OutOfResourcesError
from engine.layers.gdn import GatedDeltaNetAttention, GDNMetadata
from engine.sample.ops.torch_utils import async_tensor_h2d

NULL_SLOT = 0


class MambaStateCache:
    def __init__(self, layers: list[GatedDeltaNetAttention], num_slots: int,
                 device: torch.device, conv_dtype: torch.dtype, ssm_dtype: torch.dtype,
                 conv_shape: tuple[int, ...], ssm_shape: tuple[int, ...]) -> None:
        self.device = device
        for layer in layers:  # vLLM's bind_kv_cache for MambaBase layers
            layer.conv_state = torch.zeros(num_slots + 1, *conv_shape, dtype=conv_dtype,
                                           device=device)
            layer.ssm_state = torch.zeros(num_slots + 1, *ssm_shape, dtype=ssm_dtype,
                                          device=device)
        self.layers = layers
        self.free_slots = list(range(num_slots, 0, -1))  # pop() hands out 1 first
        self.slot_of: dict[str, int] = {}

    @classmethod
    def for_model(cls, model: nn.Module, num_slots: int, device: torch.device
                  ) -> MambaStateCache | None:
        """The state pool of a hybrid model (None for a model without GDN layers)."""
        layers = [m for m in model.modules() if isinstance(m, GatedDeltaNetAttention)]
        if not layers:
            return None
        cfg = model.config
        dtype = next(model.parameters()).dtype
        conv_dtype, ssm_dtype = gdn_state_dtypes(cfg, dtype)
        conv_shape, ssm_shape = gdn_state_shapes(cfg)
        return cls(layers, num_slots, device, conv_dtype, ssm_dtype, conv_shape, ssm_shape)

    def add(self, req_id: str, num_computed_tokens: int) -> None:
        """A slot for a request scheduled new (its state zeroed)."""
        if num_computed_tokens:
            raise InvalidArgumentError(
                f"request {req_id!r} starts at token {num_computed_tokens} but hybrid "
                "(Gated DeltaNet) models keep no state for cached prefixes: run them with "
                "enable_prefix_caching off (vLLM mamba_cache_mode 'none')")
        self.free(req_id)
        if not self.free_slots:
            raise OutOfResourcesError("no free Gated DeltaNet state slot (more running "
                                      "requests than max_num_seqs)")
        slot = self.slot_of[req_id] = self.free_slots.pop()
        for layer in self.layers:
            layer.conv_state[slot].zero_()
            layer.ssm_state[slot].zero_()

    def free(self, req_id: str) -> None:
        slot = self.slot_of.pop(req_id, None)
        if slot is not None:
            self.free_slots.append(slot)

    def build_metadata(self, req_ids: list[str], num_computed: list[int],
                       query_start_loc: list[int], max_query_len: int) -> GDNMetadata:
        """This step's GDN metadata (decode rows and prefill chunks alike)."""
        slots = [self.slot_of[r] for r in req_ids]
        init = [c > 0 for c in num_computed]
        return GDNMetadata(
            query_start_loc, slots, init, max_query_len,
            async_tensor_h2d(query_start_loc, torch.int32, self.device),
            async_tensor_h2d(slots, torch.long, self.device),
            async_tensor_h2d(init, torch.bool, self.device))
