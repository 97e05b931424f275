"""fused_experts on the Triton kernels: the CUDA path of the MoE layer.

Mirrors vllm/model_executor/layers/fused_moe/fused_moe.py (fused_experts_impl,
_prepare_expert_assignment), unquantized, no expert map: one launch of fused_moe_kernel for
the merged gate|up projection (w13) over every (token, expert) pair, SiLU-and-mul (with
SiLU in that launch's epilogue, ours: upstream runs it as a kernel of its own), one launch
for the down projection (w2) with the routing weight applied in its epilogue, then
the top-k partial outputs summed per token (upstream's moe_sum, kernels/moe_sum.py). Pairs
are grouped by expert with moe_align_block_size, except when the batch is much smaller than
the expert count (M * top_k * 4 <= E: batch-1..4 decode of Qwen3-30B-A3B, E = 128, top-8):
then each 16-row block holds one pair (upstream's naive_block_assignment) and no alignment
runs. Either way each block reads its expert's weights once, the launch configs depend only
on the host ints M, E, N, K (get_config), and nothing is read back on the host: CUDA graphs
replay it at a padded M and async scheduling never waits on it. In that sparse regime, with
SiLU, the layer instead runs two GEMV launches (kernels/fused_moe_gemv.py: w13 with
SiLU-and-mul fused, w2 with the weighted top-k sum fused), which stream the selected
experts' weights nearer HBM bandwidth; `allow_gemv=False` keeps the kernels above
(benchmarks). Every float dtype takes it: fp32 stays fp32 arithmetic throughout. Block-FP8
experts (use_fp8_w8a8 with a block_shape, Fp8MoEMethod's) take the FP8 pair there
(kernels/fused_moe_gemv_fp8.py: activations quantized per token group as the GEMM path
quantizes them, fp8 weights read at half the bytes); per-channel / per-tensor FP8 runs the
GEMM at every M.
fused_moe_triton is the layer's entry (upstream's fused_moe: router logits in, fused_topk
then fused_experts): on the GEMV path with at most 512 experts the two GEMV launches route
their own tokens from the logits (the kernels call the top-k softmax's helper, so the
experts are fused_topk's), and no top-k launch runs; otherwise fused_topk, then
fused_experts_triton. Given a gated shared expert's output and gate logit (FusedMoE's folded
path, Qwen3-Next), the w2 launch adds sigmoid(gate) * shared in its epilogue.
"""

from __future__ import annotations

import torch
from torch import nn

from libvllm.engine.layers.activation import SiluAndMul
from libvllm.engine.layers.fused_moe.config import get_config_dtype_str, try_get_optimal_moe_config
from libvllm.engine.layers.fused_moe.router import fused_topk

ROUTED_MAX_EXPERTS = 512  # kernels/fused_moe_gemv.py's (kernels/ is imported lazily)


def _is_sparse(m: int, top_k: int, num_experts: int) -> bool:
    """Far fewer pairs than experts: one pair per block, upstream's naive assignment."""
    return m * top_k * 4 <= num_experts


def _takes_gemv(m: int, top_k: int, num_experts: int, act: nn.Module) -> bool:
    """The sparse regime with SiLU: the two GEMV launches of kernels/fused_moe_gemv.py."""
    return _is_sparse(m, top_k, num_experts) and isinstance(act, SiluAndMul)


def _prepare_expert_assignment(topk_ids: torch.Tensor, config: dict, num_experts: int
                               ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
    """(sorted_token_ids, expert_ids, num_tokens_post_padded) for the kernel; upstream's
    naive assignment is (None, topk_ids flattened, None)."""
    from libvllm.kernels.moe_align_block_size import moe_align_block_size  # lazy: triton

    m, top_k = topk_ids.shape
    if _is_sparse(m, top_k, num_experts):  # one pair per block, nothing to align
        return None, topk_ids.reshape(-1), None
    return moe_align_block_size(topk_ids, config["BLOCK_SIZE_M"], num_experts)


def fused_experts_triton(hidden_states: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                         topk_weights: torch.Tensor, topk_ids: torch.Tensor, act: nn.Module,
                         config: dict | None = None, allow_gemv: bool = True, *,
                         use_fp8_w8a8: bool = False, w1_scale: torch.Tensor | None = None,
                         w2_scale: torch.Tensor | None = None,
                         a1_scale: torch.Tensor | None = None,
                         a2_scale: torch.Tensor | None = None,
                         block_shape: list[int] | None = None) -> torch.Tensor:
    """hidden_states [M, H]; w13 [E, 2I, H]; w2 [E, H, I]; topk_weights [M, k] fp32;
    topk_ids [M, k] -> [M, H]. `config` overrides try_get_optimal_moe_config (the GEMM
    path's). The sparse regime with SiLU takes the GEMV path unless allow_gemv is False.
    use_fp8_w8a8: fp8 w13 / w2 with scales w1_scale / w2_scale (upstream's names and
    layouts, kernels/fused_moe.py invoke_fused_moe_kernel), each GEMM's activations
    quantized in its launcher (a1_scale / a2_scale static, None dynamic); in the GEMV
    regime block-FP8 weights (block_shape, dynamic) take the FP8 GEMV pair, per-channel and
    per-tensor ones the GEMM."""
    from libvllm.kernels.fused_moe import invoke_fused_moe_kernel  # lazy: triton
    from libvllm.kernels.moe_sum import moe_sum

    m, h = hidden_states.shape
    num_experts, n2, _ = w13.shape
    top_k = topk_ids.shape[1]
    if m == 0:
        return torch.empty_like(hidden_states)
    if allow_gemv and _takes_gemv(m, top_k, num_experts, act):
        if not use_fp8_w8a8:
            return _fused_experts_gemv(hidden_states, w13, w2, topk_weights, topk_ids)
        if _is_block_fp8_dynamic(block_shape, a1_scale, a2_scale):
            return _fused_experts_gemv_fp8(hidden_states, w13, w2, topk_weights, topk_ids,
                                           w1_scale, w2_scale, block_shape)
    if config is None:
        dtype_str = "fp8_w8a8" if use_fp8_w8a8 else get_config_dtype_str(hidden_states.dtype)
        config = try_get_optimal_moe_config(tuple(w13.shape), tuple(w2.shape), top_k,
                                            dtype_str, m, block_shape)
    q1 = q2 = {}  # each launch's FP8 keywords
    if use_fp8_w8a8:
        q1 = dict(use_fp8_w8a8=True, block_shape=block_shape, A_scale=a1_scale,
                  B_scale=w1_scale)
        q2 = dict(q1, A_scale=a2_scale, B_scale=w2_scale)
    hidden_states = hidden_states.contiguous()
    topk_weights = topk_weights.float().contiguous()
    sorted_ids, expert_ids, post_pad = _prepare_expert_assignment(topk_ids, config,
                                                                  num_experts)
    dev, dtype = hidden_states.device, hidden_states.dtype
    if isinstance(act, SiluAndMul):  # SiLU-and-mul in the w13 launch's epilogue
        cache2 = torch.empty(m * top_k, n2 // 2, dtype=dtype, device=dev)  # [M * k, I]
        invoke_fused_moe_kernel(hidden_states, w13, cache2, topk_weights, sorted_ids,
                                expert_ids, post_pad, False, top_k, config, silu_and_mul=True,
                                **q1)
    else:
        cache1 = torch.empty(m * top_k, n2, dtype=dtype, device=dev)  # gate | up per pair
        invoke_fused_moe_kernel(hidden_states, w13, cache1, topk_weights, sorted_ids,
                                expert_ids, post_pad, False, top_k, config, **q1)
        cache2 = act(cache1)  # [M * k, I]
    cache3 = torch.empty(m, top_k, h, dtype=dtype, device=dev)  # weighted, per pair
    invoke_fused_moe_kernel(cache2, w2, cache3, topk_weights, sorted_ids, expert_ids,
                            post_pad, True, 1, config, **q2)
    return moe_sum(cache3)  # [M, H]


def _fused_experts_gemv(hidden_states: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                        topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """fused_experts_triton's sparse SiLU path in two launches. Shapes as there."""
    from libvllm.kernels.fused_moe_gemv import fused_moe_gemv_w2, fused_moe_gemv_w13  # lazy: triton

    ids = topk_ids.contiguous()
    act = fused_moe_gemv_w13(hidden_states.contiguous(), w13, ids)  # [M * k, I]
    return fused_moe_gemv_w2(act, w2, topk_weights.float().contiguous(), ids)


def _is_block_fp8_dynamic(block_shape: list[int] | None, a1_scale: torch.Tensor | None,
                          a2_scale: torch.Tensor | None) -> bool:
    """Block-FP8 weights with dynamic per-token-group activations (the only activation
    scheme block FP8 has): the FP8 GEMV pair's inputs; per-channel / per-tensor FP8 keeps
    the fused_moe_kernel path."""
    return block_shape is not None and a1_scale is None and a2_scale is None


def _fused_experts_gemv_fp8(hidden_states: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                            topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                            w1_scale: torch.Tensor, w2_scale: torch.Tensor,
                            block_shape: list[int]) -> torch.Tensor:
    """fused_experts_triton's sparse SiLU path for block-FP8 experts
    (kernels/fused_moe_gemv_fp8.py: two quantizations, two GEMV launches). Shapes as
    there; w1_scale [E, 2I / bn, H / bk], w2_scale [E, H / bn, I / bk]."""
    from libvllm.kernels.fused_moe_gemv_fp8 import fused_moe_gemv_fp8  # lazy: triton

    return fused_moe_gemv_fp8(hidden_states, w13, w1_scale, w2, w2_scale,
                              topk_weights.float().contiguous(), topk_ids.contiguous(),
                              list(block_shape))


def _takes_routed_gemv(m: int, top_k: int, num_experts: int, act: nn.Module) -> bool:
    """Whether fused_moe_triton (allow_gemv) runs the two routed GEMV launches."""
    return (m > 0 and num_experts <= ROUTED_MAX_EXPERTS
            and _takes_gemv(m, top_k, num_experts, act))


def fused_moe_triton(hidden_states: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                     gating_output: torch.Tensor, top_k: int, renormalize: bool,
                     act: nn.Module, allow_gemv: bool = True,
                     shared_out: torch.Tensor | None = None,
                     shared_gate: torch.Tensor | None = None, *, use_fp8_w8a8: bool = False,
                     w1_scale: torch.Tensor | None = None,
                     w2_scale: torch.Tensor | None = None,
                     a1_scale: torch.Tensor | None = None,
                     a2_scale: torch.Tensor | None = None,
                     block_shape: list[int] | None = None) -> torch.Tensor:
    """hidden_states [M, H]; w13 [E, 2I, H]; w2 [E, H, I]; gating_output [M, E] router
    logits (softmax top-k, as fused_topk; any row stride) -> [M, H]. With shared_out [M, H]
    and shared_gate [M, 1]: + sigmoid(shared_gate) * shared_out (a gated shared expert),
    in the w2 launch's epilogue on the routed path, else as torch ops. use_fp8_w8a8 and the
    scales: fused_experts_triton's (no routed GEMV path)."""
    m = hidden_states.shape[0]
    num_experts = w13.shape[0]
    if not (allow_gemv and not use_fp8_w8a8
            and _takes_routed_gemv(m, top_k, num_experts, act)):
        topk_weights, topk_ids = fused_topk(gating_output, top_k, renormalize)
        out = fused_experts_triton(hidden_states, w13, w2, topk_weights, topk_ids, act,
                                   allow_gemv=allow_gemv, use_fp8_w8a8=use_fp8_w8a8,
                                   w1_scale=w1_scale, w2_scale=w2_scale, a1_scale=a1_scale,
                                   a2_scale=a2_scale, block_shape=block_shape)
        if shared_out is not None:
            out = out + torch.sigmoid(shared_gate) * shared_out
        return out
    from libvllm.kernels.fused_moe_gemv import (  # lazy: triton
        fused_moe_gemv_w2_routed,
        fused_moe_gemv_w13_routed,
    )

    logits = gating_output  # [M, E], rows strided (a view) or not
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    act_rows = fused_moe_gemv_w13_routed(hidden_states.contiguous(), w13, logits, top_k)
    return fused_moe_gemv_w2_routed(act_rows, w2, logits, top_k, renormalize,
                                    shared_out=shared_out, shared_gate=shared_gate)  # [M, H]
