"""FusedMoE: router top-k, then the experts, on stacked w13 (gate | up) and w2 weights.

Mirrors vllm/model_executor/layers/fused_moe/layer.py (FusedMoE, its weight_loader into
the stacked expert parameters and make_expert_params_mapping). Dispatch: on CUDA the
Triton path (triton_experts.py fused_moe_triton, from the router logits: at decode the
top-k is folded into the expert GEMVs; vLLM's default), or with LIBVLLM_MOE_BACKEND=torch the
earlier torch grouped-GEMM path (torch_experts.py: torch._grouped_mm in bf16, every
expert densely otherwise), kept as the fallback should the Triton path fail on a device.
On the CPU the host path `fused_experts`. The variable is read when the layer is built.
A GGUF file loaded for CUDA may leave the experts as raw blocks (`gguf_experts`,
gguf_experts.py; set by engine/model_loader/gguf_quant.py, which drops w13/w2).
`shared_experts` (vLLM's SharedFusedMoE; shared_expert.py for Qwen2-MoE / Qwen3-Next) is
run on every token and added to the routed output. Given the shared experts' gate logit
(`shared_gate`, Qwen3-Next's block computes it in its router GEMV), the layer applies the
sigmoid gate; on CUDA (unsharded) the shared expert runs first and fused_moe_triton adds
sigmoid(gate) * shared, in the routed w2 launch's epilogue at decode.
Tensor parallel (vLLM's TP MoE, no expert parallel): every rank holds every expert and its
slice of the intermediate dim (w13 rows of gate and of up, w2 columns); the routed output
is all-reduced (the shared experts reduce in their own RowParallelLinear).
FP8 experts (vLLM's Fp8MoEMethod, engine/layers/quantization/fp8.py `quant_method`): w13 /
w2 in fp8 with their scales (w13_weight_scale_inv, ...: loaded per expert through the
method's scale loaders); on CUDA the method runs fused_experts_triton with vLLM's fp8
keywords after fused_topk; on the CPU the method has dequantized them at load.
"""

from __future__ import annotations

import torch
from torch import nn

from libvllm.engine import envs
from libvllm.engine.distributed.communication_op import tensor_model_parallel_all_reduce
from libvllm.engine.distributed.parallel_state import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
)
from libvllm.engine.errors import InvalidArgumentError, ModelLoadError
from libvllm.engine.layers.activation import get_act_and_mul_fn
from libvllm.engine.layers.fused_moe.gguf_experts import GGUFExperts
from libvllm.engine.layers.fused_moe.router import fused_topk
from libvllm.engine.layers.fused_moe.torch_experts import (
    fused_experts,
    fused_experts_dense,
    fused_experts_grouped,
)
from libvllm.engine.layers.fused_moe.triton_experts import fused_moe_triton
from libvllm.engine.layers.linear import apply_keeping_dtypes, new_weight

MOE_BACKENDS = ("triton", "torch")


def moe_backend() -> str:
    """LIBVLLM_MOE_BACKEND: "triton" (default) or "torch"; anything else is an error."""
    backend = envs.LIBVLLM_MOE_BACKEND
    if backend not in MOE_BACKENDS:
        raise InvalidArgumentError(f"LIBVLLM_MOE_BACKEND={backend!r} is not one of "
                                   f"{', '.join(MOE_BACKENDS)}")
    return backend


class FusedMoE(nn.Module):
    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int,
                 renormalize: bool = True, activation: str = "silu",
                 shared_experts: nn.Module | None = None) -> None:
        super().__init__()
        self.shared_experts = shared_experts  # added to the routed output (SharedFusedMoE)
        self.num_experts = num_experts
        self.top_k = top_k
        self.tp_rank = get_tensor_model_parallel_rank()
        self.tp_size = get_tensor_model_parallel_world_size()
        if intermediate_size % self.tp_size:
            raise InvalidArgumentError(f"moe_intermediate_size {intermediate_size} is not "
                                       f"divisible by tensor_parallel_size {self.tp_size}")
        self.intermediate_size = intermediate_size // self.tp_size  # per rank
        self.renormalize = renormalize
        self.backend = moe_backend()
        self.gguf_experts: GGUFExperts | None = None  # set by the GGUF loader on CUDA
        self.quant_method = None  # engine/layers/quantization/fp8.py Fp8MoEMethod
        self.act = get_act_and_mul_fn(activation)
        i = self.intermediate_size
        self.w13_weight = new_weight(num_experts, 2 * i, hidden_size)  # [E, 2 * I / tp, H]
        self.w2_weight = new_weight(num_experts, hidden_size, i)  # [E, H, I / tp]
        self.w13_weight.weight_loader = self.weight_loader
        self.w2_weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, weight_name: str,
                      shard_id: str, expert_id: int | None = None) -> int:
        """One expert's w1 (gate), w3 (up) or w2 (down) into the stacked parameter; with
        expert_id None, all experts at once (GGUF's ffn_*_exps: [E, rows, cols]). Takes
        this rank's slice of the intermediate dim; returns the elements written."""
        i = self.intermediate_size
        rows = {"w1": slice(0, i), "w3": slice(i, 2 * i), "w2": slice(None)}[shard_id]
        dst = param.data[:, rows] if expert_id is None else param.data[expert_id, rows]
        if self.tp_size > 1 and loaded.dim() >= 2:  # the intermediate dim: -2 (w1/w3), -1
            dim = -1 if shard_id == "w2" else -2
            if loaded.shape[dim] == i * self.tp_size:
                loaded = loaded.narrow(dim, self.tp_rank * i, i)
        if tuple(loaded.shape) != tuple(dst.shape):
            raise ModelLoadError(f"{weight_name} has shape {tuple(loaded.shape)}, "
                                 f"want {tuple(dst.shape)}")
        dst.copy_(loaded.to(param.dtype))
        return dst.numel()

    def forward(self, hidden_states: torch.Tensor, router_logits: torch.Tensor,
                shared_gate: torch.Tensor | None = None) -> torch.Tensor:
        # hidden_states: [n, H]; router_logits: [n, E] (any row stride) -> [n, H].
        # shared_gate: [n, 1] logits of the shared experts' sigmoid gate when the caller
        # computed them with the router (Qwen3-Next: one GEMV), the experts then ungated
        if shared_gate is not None and self.folds_shared_gate(hidden_states):
            shared = self.shared_experts(hidden_states)  # [n, H], before the routed pair
            return fused_moe_triton(hidden_states, self.w13_weight, self.w2_weight,
                                    router_logits, self.top_k, self.renormalize, self.act,
                                    shared_out=shared, shared_gate=shared_gate)
        out = tensor_model_parallel_all_reduce(self.routed_experts(hidden_states,
                                                                   router_logits))
        if self.shared_experts is not None:
            shared = self.shared_experts(hidden_states)
            if shared_gate is not None:
                shared = torch.sigmoid(shared_gate) * shared
            out = out + shared
        return out

    def folds_shared_gate(self, hidden_states: torch.Tensor) -> bool:
        """Whether the gated shared expert goes to fused_moe_triton (on CUDA, unsharded),
        which adds it in its routed w2 launch at decode and as torch ops otherwise."""
        return (hidden_states.is_cuda and self.backend == "triton" and self.tp_size == 1
                and self.gguf_experts is None and self.quant_method is None
                and self.shared_experts is not None)

    def routed_experts(self, hidden_states: torch.Tensor, router_logits: torch.Tensor
                       ) -> torch.Tensor:
        # the routing is fused_topk (softmax) everywhere: the Triton path may fold it into
        # the experts' GEMV launches (fused_moe_triton), which route as fused_topk does
        if hidden_states.is_cuda and self.backend == "triton" and self.gguf_experts is None \
                and self.quant_method is None:
            return fused_moe_triton(hidden_states, self.w13_weight, self.w2_weight,
                                    router_logits, self.top_k, self.renormalize, self.act)
        topk_weights, topk_ids = fused_topk(router_logits, self.top_k, self.renormalize)
        if self.quant_method is not None:  # CUDA: fp8 experts
            return self.quant_method.apply(self, hidden_states, topk_weights, topk_ids)
        if self.gguf_experts is not None:
            return self.gguf_experts(hidden_states, topk_weights, topk_ids, self.act)
        args = (hidden_states, self.w13_weight, self.w2_weight, topk_weights)
        experts = fused_experts
        if hidden_states.is_cuda:
            experts = fused_experts_grouped if hidden_states.dtype == torch.bfloat16 \
                else fused_experts_dense
        return experts(*args, topk_ids.long(), self.act)

    def _apply(self, fn, recurse=True):
        return apply_keeping_dtypes(self, fn, recurse, super()._apply)

    @staticmethod
    def make_expert_params_mapping(ckpt_gate_proj_name: str, ckpt_down_proj_name: str,
                                   ckpt_up_proj_name: str, num_experts: int
                                   ) -> list[tuple[str, str, int, str]]:
        """(param_name, checkpoint name fragment, expert_id, shard_id) for every expert."""
        shards = [("w1", ckpt_gate_proj_name), ("w2", ckpt_down_proj_name),
                  ("w3", ckpt_up_proj_name)]
        return [("experts.w13_" if shard_id in ("w1", "w3") else "experts.w2_",
                 f"experts.{expert_id}.{name}.", expert_id, shard_id)
                for expert_id in range(num_experts) for shard_id, name in shards]

    @staticmethod
    def make_stacked_expert_params_mapping() -> list[tuple[str, str, None, str]]:
        """The same for all experts in one tensor (GGUF's ffn_{gate,up,down}_exps, which
        engine/model_loader/gguf_loader.py names experts.{gate,up,down}_proj)."""
        return [("experts.w13_", "experts.gate_proj.", None, "w1"),
                ("experts.w2_", "experts.down_proj.", None, "w2"),
                ("experts.w13_", "experts.up_proj.", None, "w3")]
