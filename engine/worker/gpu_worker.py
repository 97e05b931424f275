"""How much GPU memory the KV cache may take, as vllm/v1/worker/gpu_worker.py
(determine_available_memory) and vllm/utils/mem_utils.py (memory_profiling).

The model runner's profile_run does one forward pass at max_num_batched_tokens (and the
sampler's logits peak) before the KV cache exists (a hybrid's GDN cores run in it, on a
scratch state: their temporaries at the full chunk count); then

    kv_cache_bytes = total * gpu_memory_utilization
                     - (torch peak + non-torch memory + CUDA-graph memory)

where the torch peak includes the weights and the activation peak, and non-torch memory
is what the device reports used beyond torch's reserved pool (CUDA context, cuBLAS
workspaces, other processes). CUDA graphs are captured after the KV cache into one pool
whose size is about the activation peak of the largest captured forward (largest first,
the smaller graphs reuse it) plus every graph's output, which stays. The graphs are the
resolved ones (engine/resolved_config.py CompilationConfig.capture_sizes: sizes and mode),
as the dispatcher keys them (engine/worker/cudagraph_dispatcher.py capture_descs): none
for NONE (estimate 0, as vLLM's determine_available_memory skips
profile_cudagraph_memory), decode graphs up to max_num_seqs only for FULL_DECODE_ONLY,
both routines' for FULL_AND_PIECEWISE. The profile measures the largest one's forward
and adds the output rows [num_tokens, hidden] of every other graph, as
vllm/v1/worker/gpu_model_runner.py profile_cudagraph_memory adds a shared first capture
to a per-graph cost for each further descriptor. The pool measured after capture is kept
beside it (model_runner.memory_profile["cudagraph_pool"]). Both profile passes run
once first with their Triton launches only compiling, side by side (kernels/_common.py
precompile_triton), so the measured passes compile nothing; beside them, a forward at a
token count of each fused-MoE launch config compiles the variants eager steps reach.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from libvllm.engine.compilation_config import CaptureSizes
from libvllm.engine.layers.fused_moe.config import get_config_dtype_str, try_get_optimal_moe_config
from libvllm.engine.layers.fused_moe.layer import FusedMoE
from libvllm.engine.layers.quantization.fp8 import Fp8MoEMethod
from libvllm.engine.worker.cudagraph_dispatcher import BatchDescriptor, CudagraphDispatcher
from libvllm.engine.worker.model_runner import ModelRunner
from libvllm.kernels._common import precompile_triton

logger = logging.getLogger(__name__)

_GIB = 1 << 30


def determine_available_memory(runner: ModelRunner, num_tokens: int,
                               gpu_memory_utilization: float,
                               capture_sizes: CaptureSizes) -> int:
    """Bytes left for the KV cache (may be <= 0: the caller reports it). capture_sizes:
    the graphs capture_model will capture (ResolvedConfig.compilation.capture_sizes())."""
    device = runner.device
    descs = CudagraphDispatcher(capture_sizes.mode,
                                [s for s in capture_sizes if s <= num_tokens],
                                runner.max_num_reqs).capture_descs()  # largest first
    largest = [descs[0].num_tokens] if descs else []
    with precompile_triton():  # the two passes' Triton variants, side by side
        runner.profile_run(num_tokens)
        for n in (*_moe_config_token_counts(runner.model, num_tokens), *largest):
            runner.profile_run(n, sample=False)
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    runner.profile_run(num_tokens)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    cudagraph = cudagraph_memory_estimate(descs, lambda n: _measure_forward(runner, n))
    free, total = torch.cuda.mem_get_info(device)
    non_torch = max(0, total - free - torch.cuda.memory_reserved(device))
    torch.cuda.empty_cache()
    available = int(total * gpu_memory_utilization) - peak - non_torch - cudagraph
    runner.memory_profile = {"total": total, "torch_peak": peak, "non_torch": non_torch,
                             "cudagraph_estimate": cudagraph, "available": available}
    logger.info("memory profile: total %.2f GiB x %.2f, torch peak %.2f GiB, non-torch "
                "%.2f GiB, CUDA graphs %.2f GiB -> KV cache %.2f GiB", total / _GIB,
                gpu_memory_utilization, peak / _GIB, non_torch / _GIB, cudagraph / _GIB,
                available / _GIB)
    return available


def _moe_config_token_counts(model: torch.nn.Module, num_tokens: int) -> list[int]:
    """The first token count below num_tokens of each fused-MoE launch config the model's
    layers pick (engine/layers/fused_moe/config.py try_get_optimal_moe_config: a tuned
    table's nearest key, else the default's M ranges), looked up under the layer's own
    file name and default (_moe_config_key: FP8 experts' dtype and block shape). Each
    config is its own Triton variant (block sizes, GROUP_SIZE_M), which an eager step of
    such a count would otherwise compile mid-run (Qwen3-30B-A3B on the H200: 1,793 to
    6,144 tokens take a GROUP_SIZE_M 16 config that neither the profile run nor a graph
    reaches)."""
    keys = {_moe_config_key(layer) for layer in model.modules()
            if isinstance(layer, FusedMoE) and layer.w13_weight is not None}
    counts = set()
    for w1, w2, top_k, dtype, block_shape in keys:
        seen = set()
        for m in range(1, num_tokens):
            config = try_get_optimal_moe_config(w1, w2, top_k, dtype, m,
                                                list(block_shape) if block_shape else None)
            config = tuple(sorted(config.items()))
            if config not in seen:
                seen.add(config)
                counts.add(m)
    return sorted(counts)


def _moe_config_key(layer: FusedMoE) -> tuple:
    """(w1 shape, w2 shape, top_k, config dtype, block shape or None) as the layer's
    launches look their config up: FP8 experts (an Fp8MoEMethod, kept on CUDA) "fp8_w8a8"
    with their scheme's block shape, as Fp8MoEMethod.apply hands them to
    fused_experts_triton; else the weights' dtype (upstream _get_config_dtype_str)."""
    method = layer.quant_method
    fp8 = isinstance(method, Fp8MoEMethod)
    block = method.scheme.block if fp8 else None  # (bn, bk) of block FP8, else None
    return (tuple(layer.w13_weight.shape), tuple(layer.w2_weight.shape), layer.top_k,
            get_config_dtype_str(layer.w13_weight.dtype, use_fp8_w8a8=fp8), block)


def cudagraph_memory_estimate(descs: list[BatchDescriptor],
                              measure: Callable[[int], tuple[int, int]]) -> int:
    """Bytes of the graphs' pool for descs (largest first; none: 0): the largest one's
    forward at its peak plus the output rows of each other graph (each keeps its own).
    measure(num_tokens) -> (peak bytes of that forward, bytes of one output row)."""
    if not descs:
        return 0
    peak, row_bytes = measure(descs[0].num_tokens)
    return peak + sum(d.num_tokens for d in descs[1:]) * row_bytes


def _measure_forward(runner: ModelRunner, num_tokens: int) -> tuple[int, int]:
    """(peak bytes above the current allocation, bytes of one hidden row) of a forward
    over num_tokens tokens without sampling."""
    device = runner.device
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    hidden = runner.profile_run(num_tokens, sample=False)  # [num_tokens, hidden]
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - base,
            hidden[0].numel() * hidden.element_size())
