"""Start-up warm-up of the eager steps no CUDA graph covers, in the role of vLLM's
compile_or_warm_up_model (vllm/v1/worker/gpu_worker.py: _dummy_run warm-ups after
capture).

When mixed prefill / decode steps run eagerly (a hybrid GDN model, whose graphs are
decode-only; enforce_eager; cudagraph_mode without a mixed routine), the profile passes
never reach the kernels of a prefill with a KV cache: the GDN chunked prefill and conv-state
kernels, the unified attention with and without KV segments, the recurrent kernel beside a
prefill. The first engine of a machine then compiled them inside its first requests
(docs/BENCHMARKS.md session 29: 8 compiles, 11 s, in Qwen3.5-35B-A3B's first offline run).
Here three synthetic steps run through the model runner with Triton launches only
compiling (kernels/_common.py precompile_triton), side by side: two small prefills (KV
segments), then a decode row beside a long prefill (no segments, the decode row's
kernels), then the requests end. They use free KV blocks and GDN state slots the KV cache
manager never hands out before the runner forgets them; nothing is cached or kept.
"""

from __future__ import annotations

import logging
import time

from engine.core.sched_output import CachedRequestData, NewRequestData, SchedulerOutput
from engine.sampling_params import SamplingParams
from engine.worker.cudagraph_dispatcher import CUDAGraphMode
from engine.worker.model_runner import ModelRunner
from kernels._common import precompile_triton

logger = logging.getLogger(__name__)

SMALL = 80  # prompt tokens of the small prefills: >= 64 takes the GDN chunked kernels
LONG = 2048  # the long prefill (fewer if the context or the token budget is shorter)


def needs_eager_warm_up(runner: ModelRunner) -> bool:
    """Mixed steps run eagerly on CUDA (no mixed graph)."""
    graphs = runner.cudagraphs
    return runner.device.type == "cuda" and (
        graphs is None or graphs.dispatcher.mode.mixed_mode() == CUDAGraphMode.NONE)


def warm_up_eager_steps(runner: ModelRunner, num_blocks: int) -> float:
    """Compile the eager steps' variants (see the module docstring); the seconds taken, 0
    when the runner's limits leave no room for the steps."""
    bs = runner.block_size
    long = min(LONG, runner.max_model_len - 2, runner.max_num_tokens - 1)
    blocks = [-(-(n + 1) // bs) for n in (SMALL, SMALL, long)]
    if long < SMALL or runner.max_num_reqs < 2 or sum(blocks) > num_blocks - 1:
        return 0.0
    start = time.perf_counter()
    ids = iter(range(1, num_blocks))  # block 0 is the null block
    sp = SamplingParams(temperature=0.0, max_tokens=2)

    def new(req_id: str, n: int, num_blocks: int) -> NewRequestData:
        return NewRequestData(req_id, [0] * n, sp, [next(ids) for _ in range(num_blocks)], 0)

    a, b, c = (new(f"_warmup-{i}", n, k) for i, (n, k) in
               enumerate(zip((SMALL, SMALL, long), blocks, strict=True)))
    with precompile_triton():
        runner.execute_model(SchedulerOutput(
            [a, b], CachedRequestData(), {a.req_id: SMALL, b.req_id: SMALL}, 2 * SMALL, set()))
        runner.requests[a.req_id].token_ids[-1] = 0  # the skipped sampler left garbage
        runner.execute_model(SchedulerOutput(
            [c], CachedRequestData([a.req_id], [[]], [SMALL]), {a.req_id: 1, c.req_id: long},
            long + 1, {b.req_id}))
    runner.execute_model(SchedulerOutput([], CachedRequestData(), {}, 0,
                                         {a.req_id, c.req_id}))
    seconds = time.perf_counter() - start
    logger.info("eager steps warmed up in %.2f s", seconds)
    return seconds
