"""The block-scaled W8A8 FP8 GEMM in Triton: C = (A_q * As) @ (B_q * Bs)^T with A quantized
per token group of block_k columns (kernels/fp8_quant.py per_token_group_quant_fp8) and B
per [block_n, block_k] block (DeepSeek-V3 / Qwen3 FP8 checkpoints, weight_scale_inv).

Mirrors vllm/model_executor/layers/quantization/utils/fp8_utils.py
(_w8a8_triton_block_scaled_mm, w8a8_triton_block_scaled_mm, get_w8a8_block_fp8_configs):
each program owns a BLOCK_SIZE_M x BLOCK_SIZE_N tile of C (grouped by GROUP_SIZE_M for L2
reuse) and walks K in BLOCK_SIZE_K steps, each step one fp8 tl.dot into fp32 scaled by the
step's A-row and B-column scales. BLOCK_SIZE_K must divide block_k (a step lies in one
scale group). Launch configs: the tuned JSON file
"N={N},K={K},device_name={device},dtype=fp8_w8a8,block_shape=[{bn},{bk}].json" in
kernels/configs/fp8_block/ (kernels/tuned_configs.py reads it: batch size M -> config, the
nearest M taken; `python examples/bench/tune_fp8_block.py` writes it on the GPU it runs
on), else upstream's default (default_config). One row (batch-1 decode) without an
explicit config takes kernels/fp8_gemv.py instead.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from libvllm.kernels._common import cdiv, check, check_same_device
from libvllm.kernels.fp8_gemv import w8a8_block_fp8_gemv
from libvllm.kernels.launch_cache import cached_launch
from libvllm.kernels.launch_configs import GemmConfig
from libvllm.kernels.tuned_configs import (
    config_dir,
    config_file_name,
    device_name,
    find_configs,
    nearest,
)

CONFIG_DIR = config_dir("fp8_block")
_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@cached_launch
@triton.jit(do_not_specialize=["M"])
def _w8a8_block_fp8_matmul_kernel(
    A, B, C, As, Bs, M, N, K, group_n, group_k,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    stride_As_m, stride_As_k, stride_Bs_k, stride_Bs_n,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
):
    # A [M, K] fp8, B [N, K] fp8 (read as [K, N]), As [M, cdiv(K, group_k)],
    # Bs [cdiv(N, group_n), cdiv(K, group_k)] fp32 -> C [M, N]
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + (pid % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    # rows and columns past the edge wrap onto valid ones (their results are not stored)
    offs_am = ((pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)) % M).to(tl.int64)
    offs_bn = ((pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = A + (offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak)
    b_ptrs = B + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)
    As_ptrs = As + offs_am * stride_As_m
    Bs_ptrs = Bs + (offs_bn // group_n) * stride_Bs_n

    accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        k_left = K - k * BLOCK_SIZE_K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        offs_ks = (k * BLOCK_SIZE_K) // group_k
        a_s = tl.load(As_ptrs + offs_ks * stride_As_k)
        b_s = tl.load(Bs_ptrs + offs_ks * stride_Bs_k)
        accumulator += tl.dot(a, b) * a_s[:, None] * b_s[None, :]
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk

    c = accumulator.to(C.dtype.element_ty)
    offs_cm = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_ptrs = C + stride_cm * offs_cm[:, None].to(tl.int64) + stride_cn * offs_cn[None, :]
    tl.store(c_ptrs, c, mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))


def get_config_file_name(N: int, K: int, block_n: int, block_k: int,
                         device: str | None = None) -> str:
    """Upstream's name of the tuned file of an [N, K] weight in [block_n, block_k] blocks."""
    return config_file_name({"N": N, "K": K}, device or device_name(), "fp8_w8a8",
                            [block_n, block_k])


@functools.lru_cache
def get_w8a8_block_fp8_configs(N: int, K: int, block_n: int, block_k: int
                               ) -> dict[int, GemmConfig] | None:
    """{M: config} of the tuned file for this shape and device, or None."""
    return find_configs(get_config_file_name(N, K, block_n, block_k), [CONFIG_DIR],
                        GemmConfig, "W8A8 Block FP8 kernel", "W8A8 Block FP8 kernel")


def default_config(block_n: int, block_k: int) -> GemmConfig:
    """Upstream's default: the tile is one weight scale block, 64 rows, GROUP_SIZE_M 32."""
    return GemmConfig(BLOCK_SIZE_M=64, BLOCK_SIZE_N=block_n, BLOCK_SIZE_K=block_k,
                      GROUP_SIZE_M=32, num_warps=4, num_stages=2)


def get_config(M: int, N: int, K: int, block_n: int, block_k: int) -> GemmConfig:
    """The tuned config of the nearest M, else default_config."""
    configs = get_w8a8_block_fp8_configs(N, K, block_n, block_k)
    return nearest(configs, M) if configs else default_config(block_n, block_k)


def _check_args(A: torch.Tensor, B: torch.Tensor, As: torch.Tensor, Bs: torch.Tensor,
                block_size: list[int], output_dtype: torch.dtype) -> None:
    check(len(block_size) == 2 and min(block_size) > 0,
          lambda: f"block_size must be [block_n, block_k], got {block_size}")
    check(A.dtype == torch.float8_e4m3fn and B.dtype == torch.float8_e4m3fn,
          lambda: f"A and B must be float8_e4m3fn, got {A.dtype}, {B.dtype}")
    check(As.dtype == torch.float32 and Bs.dtype == torch.float32,
          lambda: f"As and Bs must be float32, got {As.dtype}, {Bs.dtype}")
    check(output_dtype in _OUT_DTYPES,
          lambda: f"output_dtype must be bfloat16, float16 or float32, got {output_dtype}")
    check_same_device(A=A, B=B, As=As, Bs=Bs)
    check(A.dim() >= 2 and A.shape[-1] == B.shape[-1] and A.is_contiguous(),
          lambda: f"A [..., K] must be contiguous with B [N, K]'s K, got "
                  f"{tuple(A.shape)}, {tuple(B.shape)}")
    block_n, block_k = block_size
    check(A.shape[:-1] == As.shape[:-1] and As.shape[-1] == cdiv(A.shape[-1], block_k),
          lambda: f"As must be [..., cdiv(K, {block_k})] for A {tuple(A.shape)}, "
                  f"got {tuple(As.shape)}")
    check(B.dim() == 2 and Bs.dim() == 2
          and tuple(Bs.shape) == (cdiv(B.shape[0], block_n), cdiv(B.shape[1], block_k)),
          lambda: f"Bs must be [cdiv(N, {block_n}), cdiv(K, {block_k})] for B "
                  f"{tuple(B.shape)}, got {tuple(Bs.shape)}")


def w8a8_block_fp8_matmul(A: torch.Tensor, B: torch.Tensor, As: torch.Tensor,
                          Bs: torch.Tensor, block_size: list[int],
                          output_dtype: torch.dtype = torch.bfloat16,
                          config: GemmConfig | None = None) -> torch.Tensor:
    """A [..., K] fp8 (contiguous), B [N, K] fp8, As [..., cdiv(K, bk)] fp32,
    Bs [cdiv(N, bn), cdiv(K, bk)] fp32, block_size [bn, bk] -> C [..., N] output_dtype.
    `config` overrides get_config (the tuner's) and keeps one row on the GEMM."""
    _check_args(A, B, As, Bs, block_size, output_dtype)
    block_n, block_k = block_size
    N, K = B.shape
    a2 = A.reshape(-1, K)  # [M, K]
    as2 = As.reshape(-1, As.shape[-1])  # [M, cdiv(K, bk)]
    M = a2.shape[0]
    C = torch.empty((*A.shape[:-1], N), dtype=output_dtype, device=A.device)
    if M == 0 or N == 0:
        return C
    if (M == 1 and config is None and B.is_contiguous() and as2.stride(1) == 1
            and Bs.stride(1) == 1):
        return w8a8_block_fp8_gemv(a2, B, as2, Bs, block_size, output_dtype).view(C.shape)
    config = (config or get_config(M, N, K, block_n, block_k)).kwargs()
    check(block_k % config["BLOCK_SIZE_K"] == 0,
          lambda: f"BLOCK_SIZE_K {config['BLOCK_SIZE_K']} must divide block_k {block_k}")
    c2 = C.view(M, N)
    grid = (cdiv(M, config["BLOCK_SIZE_M"]) * cdiv(N, config["BLOCK_SIZE_N"]),)
    _w8a8_block_fp8_matmul_kernel[grid](
        a2, B, c2, as2, Bs, M, N, K, block_n, block_k,
        a2.stride(0), a2.stride(1), B.stride(1), B.stride(0), c2.stride(0), c2.stride(1),
        as2.stride(0), as2.stride(1), Bs.stride(1), Bs.stride(0), **config,
    )
    return C


def w8a8_block_fp8_matmul_ref(A: torch.Tensor, B: torch.Tensor, As: torch.Tensor,
                              Bs: torch.Tensor, block_size: list[int],
                              output_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """The dequantized fp32 matmul, rounded once: [..., N]."""
    block_n, block_k = block_size
    N, K = B.shape
    a = A.float() * As.float().repeat_interleave(block_k, dim=-1)[..., :K]
    b = B.float() * Bs.float().repeat_interleave(block_n, 0).repeat_interleave(
        block_k, 1)[:N, :K]
    return (a @ b.t()).to(output_dtype)
