"""Row argmax for sampling in Triton: greedy argmax and the Gumbel-style random sample.

Owns argmax_rows(x, noise_q): the first maximal index of each row of x, or of
x - log(noise_q) (a random sample once noise_q ~ Exp(1) per element), in two launches with
no host sync (CUDA-graph safe). Upstream vLLM samples with argmax(probs / q)
(vllm/v1/sample/ops/topk_topp_sampler.py random_sample: `probs.div_(q).argmax(dim=-1)`),
and FlashInfer's sampling kernels fuse the draw and the reduction; ours takes the same token
as argmax(logits - log q), without the softmax (engine/sample/ops/topk_topp_sampler.py's
docstring). torch's own argmax runs one thread block per row, so a batch-1 row keeps one SM
busy (`python3 examples/bench/sampling_kernel.py` times both); here stage 1 spreads each
row over about PER_SM programs per SM, each reducing one chunk to (max value, its first
index) in fp32/int32 partials [R, C], and stage 2 takes each row's first maximum over its
chunks and writes int64. The log and the subtraction run inside stage 1, in fp32 as
torch's `x.float() - q.log()`.

Order: torch.argmax's (ATen's GreaterOrNan, CPU and CUDA alike): NaN is maximal, and among
equal values (NaNs too) the lowest index wins. log: libdevice's __nv_logf on the GPU, the
libdevice twin of the CUDA math library's logf that torch.log runs on fp32 CUDA tensors
(compiled for sm_90: a polynomial that scales a subnormal q itself, no lg2.approx; Triton's
flush-to-zero libdevice mode meets no subnormal intermediate in it), so the token should be
argmax(x - q.log())'s bit for bit; should the two builds differ in an ulp, a near-tie may
pick the other token, as fair a sample. The Triton interpreter has no libdevice: tl.log
(numpy's) there.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from libvllm.kernels import envs
from libvllm.kernels._common import (
    cdiv,
    check,
    check_float,
    check_same_device,
    next_pow2,
    pdl_launch,
    pdl_wait,
)
from libvllm.kernels._common import num_sms as _num_sms
from libvllm.kernels.launch_cache import cached_launch

BLOCK = 512  # values a stage-1 program loads per step: 4 per thread of 4 warps
PER_SM = 2  # stage-1 programs per SM a launch aims for (all rows together)
INT32_MAX = tl.constexpr(2**31 - 1)  # no index: above every real one


@triton.jit
def _first_max(v, i):
    """(value, index) of the first maximum over lanes of (value v, index i) pairs [N], in
    torch.argmax's order: NaN above everything, equal values (NaNs too) to the lowest
    index. Three plain reductions (a tuple tl.reduce runs its combine per element under
    the interpreter)."""
    nan = v != v
    m = tl.max(tl.where(nan, float("-inf"), v), 0)
    i_nan = tl.min(tl.where(nan, i, INT32_MAX), 0)
    i_max = tl.min(tl.where(v == m, i, INT32_MAX), 0)
    has_nan = i_nan < INT32_MAX
    return tl.where(has_nan, float("nan"), m), tl.where(has_nan, i_nan, i_max)


@cached_launch
@triton.jit(do_not_specialize=["chunk_steps", "num_chunks"])
def _argmax_chunk_kernel(
    x_ptr, q_ptr, part_v_ptr, part_i_ptr, vocab, stride_x: tl.int64, stride_q: tl.int64,
    chunk_steps, num_chunks, HAS_Q: tl.constexpr, LIBDEVICE_LOG: tl.constexpr,
    BLOCK: tl.constexpr, USE_PDL: tl.constexpr,
):
    if USE_PDL:  # the kernel before wrote x (and q)
        pdl_wait()
    # program (row, chunk c): steps [c * chunk_steps, (c + 1) * chunk_steps) of BLOCK values
    # of the row (step s: s * BLOCK, so the loads keep their alignment) into one
    # (value, index) partial; lanes keep their own best until the final reduce
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    offs = tl.arange(0, BLOCK)
    first = c * chunk_steps
    best_v = tl.full([BLOCK], float("-inf"), tl.float32)
    best_i = first * BLOCK + offs  # the first step's indices: an all -inf row keeps them
    for step in range(first, tl.minimum(first + chunk_steps, tl.cdiv(vocab, BLOCK))):
        idx = step * BLOCK + offs  # [BLOCK] int32
        mask = idx < vocab
        v = tl.load(x_ptr + row * stride_x + idx, mask=mask, other=float("-inf"))
        v = v.to(tl.float32)  # [BLOCK]
        if HAS_Q:
            q = tl.load(q_ptr + row * stride_q + idx, mask=mask, other=1.0)  # [BLOCK] fp32
            if LIBDEVICE_LOG:
                v = v - tl.extra.cuda.libdevice.log(q)
            else:
                v = v - tl.log(q)
        # a later step wins a lane only when above (or the first NaN): ties keep the earlier
        take = (v > best_v) | ((v != v) & (best_v == best_v))
        best_v = tl.where(take, v, best_v)
        best_i = tl.where(take, idx, best_i)
    v, i = _first_max(best_v, best_i)
    tl.store(part_v_ptr + row * num_chunks + c, v)
    tl.store(part_i_ptr + row * num_chunks + c, i)


@triton.jit(do_not_specialize=["num_chunks"])
def _argmax_merge_kernel(part_v_ptr, part_i_ptr, out_ptr, num_chunks,
                         C_PAD: tl.constexpr, USE_PDL: tl.constexpr):
    if USE_PDL:  # stage 1 wrote the partials
        pdl_wait()
    # program (row): partials [num_chunks] of the row -> out [row] int64, the first maximum
    row = tl.program_id(0).to(tl.int64)
    cs = tl.arange(0, C_PAD)
    mask = cs < num_chunks
    v = tl.load(part_v_ptr + row * num_chunks + cs, mask=mask, other=float("-inf"))
    i = tl.load(part_i_ptr + row * num_chunks + cs, mask=mask, other=INT32_MAX)
    _, best = _first_max(v, i)
    tl.store(out_ptr + row, best.to(tl.int64))


def _chunking(rows: int, vocab: int, device: torch.device) -> tuple[int, int]:
    """(chunk_steps, num_chunks): chunks of whole BLOCK steps, as many per row as bring the
    grid to about PER_SM programs per SM (batch 1 at a 128k vocab on 132 SMs: 251 chunks of
    one step; 64 rows: 5 chunks of 51 steps). Host ints only, so a CUDA graph replays it."""
    steps = cdiv(vocab, BLOCK)
    chunk_steps = cdiv(steps, min(steps, cdiv(PER_SM * _num_sms(device), rows)))
    return chunk_steps, cdiv(steps, chunk_steps)


def _libdevice_log() -> bool:
    return not envs.TRITON_INTERPRET


def argmax_rows(x: torch.Tensor, noise_q: torch.Tensor | None = None) -> torch.Tensor:
    """x: [R, V] float (last dim contiguous, any row stride), noise_q: [R, V] fp32
    contiguous or None -> [R] int64: argmax of x.float() - log(noise_q) (of x.float()
    without noise_q) per row, the first maximal index, NaN maximal (torch.argmax)."""
    check(x.dim() == 2 and x.stride(1) == 1, lambda: f"x must be [rows, vocab] with a "
          f"contiguous last dimension, got {tuple(x.shape)} strides {x.stride()}")
    check_float("x", x)
    rows, vocab = x.shape
    check(vocab > 0, "x must have vocab > 0 columns")
    if noise_q is not None:
        check(noise_q.shape == x.shape and noise_q.dtype == torch.float32
              and noise_q.is_contiguous(), lambda: f"noise_q must be a contiguous float32 "
              f"{tuple(x.shape)}, got {tuple(noise_q.shape)} {noise_q.dtype}")
        check_same_device(x=x, noise_q=noise_q)
    out = torch.empty(rows, dtype=torch.int64, device=x.device)  # [R]
    if rows == 0:
        return out
    chunk_steps, num_chunks = _chunking(rows, vocab, x.device)
    part_v = torch.empty(rows, num_chunks, dtype=torch.float32, device=x.device)  # [R, C]
    part_i = torch.empty(rows, num_chunks, dtype=torch.int32, device=x.device)  # [R, C]
    pdl = pdl_launch(x)
    _argmax_chunk_kernel[(rows, num_chunks)](
        x, x if noise_q is None else noise_q, part_v, part_i, vocab, x.stride(0),
        0 if noise_q is None else noise_q.stride(0), chunk_steps, num_chunks,
        HAS_Q=noise_q is not None, LIBDEVICE_LOG=_libdevice_log(), BLOCK=BLOCK, num_warps=4,
        **pdl,
    )
    # 64 or 512 lanes (more only past 512 chunks): two compiled variants for all batch sizes
    c_pad = 64 if num_chunks <= 64 else max(512, next_pow2(num_chunks))
    _argmax_merge_kernel[(rows,)](part_v, part_i, out, num_chunks, C_PAD=c_pad, num_warps=2,
                                  **pdl)
    return out


def argmax_rows_ref(x: torch.Tensor, noise_q: torch.Tensor | None = None) -> torch.Tensor:
    """argmax_rows in torch: (x.float() - noise_q.log()).argmax(-1), [R, V] -> [R] int64."""
    v = x.float()  # [R, V]
    if noise_q is not None:
        v = v - noise_q.log()
    return v.argmax(dim=-1)
