"""The fused MoE grouped GEMM in Triton: every (token, expert) pair's x @ W_e^T in one
launch, the routing weight applied in the fp32 epilogue.

Mirrors vllm/model_executor/layers/fused_moe/fused_moe.py (fused_moe_kernel and
invoke_fused_moe_triton_kernel, unquantized bf16/fp16/fp32 case, no expert map): the
program grid walks BLOCK_SIZE_M rows of sorted_token_ids (kernels/moe_align_block_size.py)
times BLOCK_SIZE_N output columns, grouped by GROUP_SIZE_M for L2 reuse; each block belongs
to one expert (expert_ids), so that expert's weight tile is read once per block. With
`sorted_token_ids=None` (upstream's naive_block_assignment, for batches much smaller than
the expert count) block m is pair m alone and expert_ids is topk_ids flattened: no
alignment pass (and no num_tokens_post_padded: the grid is one block per pair). Programs
past num_tokens_post_padded (read on the device) return at once, so the launch has no
host sync and a fixed grid for a fixed M (CUDA-graph safe). Launched with programmatic
dependent launch on sm_90+ like the other decode kernels (kernels/_common.py). fp32
inputs multiply in full fp32 ("ieee"), not TF32 as upstream's default, so the fp32 CUDA
path keeps the engine's fp32 results.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from libvllm.kernels._common import (
    FLOAT_DTYPES,
    cdiv,
    check,
    check_float,
    check_same_device,
    pdl_launch,
    pdl_wait,
)
from libvllm.kernels.fp8_quant import FP8_DTYPE, per_token_group_quant_fp8, scaled_fp8_quant
from libvllm.kernels.launch_cache import cached_launch

_COMPUTE_TYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16,
                  torch.float32: tl.float32}


@cached_launch
@triton.jit(do_not_specialize=["EM", "num_valid_tokens"])  # bounds, masks: any token count
def fused_moe_kernel(
    a_ptr, b_ptr, c_ptr, a_scale_ptr, b_scale_ptr, topk_weights_ptr, sorted_token_ids_ptr,
    expert_ids_ptr, num_tokens_post_padded_ptr,
    N, K, EM, num_valid_tokens,
    stride_am, stride_ak, stride_be, stride_bk, stride_bn, stride_cm, stride_cn,
    stride_asm, stride_ask, stride_bse, stride_bsk, stride_bsn,
    group_n: tl.constexpr, group_k: tl.constexpr,
    naive_block_assignment: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr, MUL_ROUTED_WEIGHT: tl.constexpr, top_k: tl.constexpr,
    compute_type: tl.constexpr, DOT_PREC: tl.constexpr, SILU_AND_MUL: tl.constexpr,
    use_fp8_w8a8: tl.constexpr, per_channel_quant: tl.constexpr, USE_PDL: tl.constexpr,
):
    # A: [M, K] tokens; B: [E, N, K] expert weights; C: [M * top_k, N] (row = pair).
    # SILU_AND_MUL: B is [E, 2N, K] (gate rows, then up rows); each program also
    # accumulates the up rows N below its gate rows and stores silu(gate) * up.
    # use_fp8_w8a8: A, B fp8; group_k > 0: A scales [M, cdiv(K, group_k)], B scales
    # [E, cdiv(N, group_n), cdiv(K, group_k)], applied per K step; else per_channel_quant:
    # A [M] (stride_asm 0: one value), B [E, N]; else A [1], B [E]: applied at the end
    if USE_PDL:  # the kernel before wrote A and the routing
        pdl_wait()
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(EM, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    offs = tl.arange(0, BLOCK_SIZE_M).to(tl.int64)
    if not naive_block_assignment:
        if pid_m * BLOCK_SIZE_M >= tl.load(num_tokens_post_padded_ptr):
            return
        offs_token = tl.load(sorted_token_ids_ptr + pid_m * BLOCK_SIZE_M + offs)
    else:  # the grid is exactly one block per pair: nothing to skip, nothing to load
        offs_token = tl.where(offs == 0, pid_m, num_valid_tokens)
    offs_token = offs_token.to(tl.int64)  # pair index; stride_cm * pair can pass 2^31
    token_mask = offs_token < num_valid_tokens

    off_experts = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    offs_bn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N).to(tl.int64)) % N
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + (offs_token[:, None] // top_k * stride_am + offs_k[None, :] * stride_ak)
    b_ptrs = (b_ptr + off_experts * stride_be
              + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn))

    if use_fp8_w8a8:  # scale pointers (per K step) or scales (applied after the loop)
        a_rows = offs_token // top_k
        bs_ptr = b_scale_ptr + off_experts * stride_bse
        if group_k > 0:
            a_scale_ptrs = a_scale_ptr + a_rows * stride_asm
            b_scale_ptrs = bs_ptr + (offs_bn // group_n) * stride_bsn
            b_up_scale_ptrs = bs_ptr + ((offs_bn + N) // group_n) * stride_bsn
        elif per_channel_quant:
            a_scale = tl.load(a_scale_ptr + a_rows * stride_asm, mask=token_mask,
                              other=0.0)[:, None]
            b_scale = tl.load(bs_ptr + offs_bn * stride_bsn)[None, :]
            if SILU_AND_MUL:
                b_up_scale = tl.load(bs_ptr + (offs_bn + N) * stride_bsn)[None, :]
        else:
            a_scale = tl.load(a_scale_ptr)
            b_scale = tl.load(bs_ptr)
            b_up_scale = b_scale

    accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    up = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)  # SILU_AND_MUL only
    for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        k_left = K - k * BLOCK_SIZE_K
        a = tl.load(a_ptrs, mask=token_mask[:, None] & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        if use_fp8_w8a8 and group_k > 0:
            offs_ks = (k * BLOCK_SIZE_K) // group_k
            a_s = tl.load(a_scale_ptrs + offs_ks * stride_ask, mask=token_mask, other=0.0)
            b_s = tl.load(b_scale_ptrs + offs_ks * stride_bsk)
            accumulator += tl.dot(a, b) * a_s[:, None] * b_s[None, :]
            if SILU_AND_MUL:
                b_up = tl.load(b_ptrs + N * stride_bn, mask=offs_k[:, None] < k_left, other=0.0)
                b_up_s = tl.load(b_up_scale_ptrs + offs_ks * stride_bsk)
                up += tl.dot(a, b_up) * a_s[:, None] * b_up_s[None, :]
        elif use_fp8_w8a8:  # acc= keeps the MMA accumulating in place
            accumulator = tl.dot(a, b, acc=accumulator)
            if SILU_AND_MUL:
                b_up = tl.load(b_ptrs + N * stride_bn, mask=offs_k[:, None] < k_left, other=0.0)
                up = tl.dot(a, b_up, acc=up)
        else:
            accumulator += tl.dot(a, b, input_precision=DOT_PREC)
            if SILU_AND_MUL:
                b_up = tl.load(b_ptrs + N * stride_bn, mask=offs_k[:, None] < k_left, other=0.0)
                up += tl.dot(a, b_up, input_precision=DOT_PREC)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk

    if use_fp8_w8a8 and group_k == 0:  # per-tensor / per-channel dequantization
        accumulator = accumulator * a_scale * b_scale
        if SILU_AND_MUL:
            up = up * a_scale * b_up_scale

    if MUL_ROUTED_WEIGHT:  # in fp32, before the single rounding
        moe_weight = tl.load(topk_weights_ptr + offs_token, mask=token_mask, other=0)
        accumulator *= moe_weight[:, None]
    accumulator = accumulator.to(compute_type)
    if SILU_AND_MUL:  # kernels/activation.py's roundings on the rounded gate and up
        gate = accumulator.to(tl.float32)
        silu = (gate / (1.0 + tl.exp(-gate))).to(compute_type)
        accumulator = (silu.to(tl.float32) * up.to(compute_type).to(tl.float32)
                       ).to(compute_type)

    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_ptrs = c_ptr + stride_cm * offs_token[:, None] + stride_cn * offs_cn[None, :]
    tl.store(c_ptrs, accumulator, mask=token_mask[:, None] & (offs_cn[None, :] < N))


def quantize_moe_input(A: torch.Tensor, A_scale: torch.Tensor | None,
                       per_act_token_quant: bool, block_shape: list[int] | None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Upstream's _fp8_quantize: A [M, K] float -> (fp8 [M, K], scales): per token group
    of block_shape[1] ([M, K / bk], dynamic) with block_shape, else scaled_fp8_quant
    (A_scale static, None dynamic; per token [M, 1] or per tensor [1])."""
    if block_shape is None:
        return scaled_fp8_quant(A, A_scale, use_per_token_if_dynamic=per_act_token_quant)
    check(not per_act_token_quant, "block-quantized activations have no per-token scales")
    return per_token_group_quant_fp8(A, block_shape[1])


def _check_fp8(A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
               A_scale: torch.Tensor | None, B_scale: torch.Tensor | None,
               block_shape: list[int] | None, per_channel_quant: bool | None) -> bool:
    """The FP8 launch's dtypes and scale shapes; whether B is quantized per channel."""
    E, N, K = B.shape
    check(B.dtype == FP8_DTYPE and (A.dtype == FP8_DTYPE or A.dtype in FLOAT_DTYPES)
          and C.dtype in FLOAT_DTYPES,
          lambda: f"use_fp8_w8a8 takes fp8 B, fp8 or float A and float C, got "
                  f"{A.dtype}, {B.dtype}, {C.dtype}")
    check(B_scale is not None and B_scale.dtype == torch.float32,
          "use_fp8_w8a8 needs B_scale in float32")
    check(A.dtype != FP8_DTYPE or A_scale is not None, "fp8 A needs its A_scale")
    check(A_scale is None or A_scale.dtype == torch.float32, "A_scale must be float32")
    if block_shape is not None:
        check(len(block_shape) == 2 and min(block_shape) > 0,
              lambda: f"block_shape must be [block_n, block_k], got {block_shape}")
        kt = cdiv(K, block_shape[1])
        check(tuple(B_scale.shape) == (E, cdiv(N, block_shape[0]), kt),
              lambda: f"B_scale must be [{E}, cdiv({N}, {block_shape[0]}), {kt}], got "
                      f"{tuple(B_scale.shape)}")
        check(A.dtype != FP8_DTYPE or tuple(A_scale.shape) == (A.shape[0], kt),
              lambda: f"A_scale must be [{A.shape[0]}, {kt}], got {tuple(A_scale.shape)}")
        return False
    if per_channel_quant is None:
        per_channel_quant = B_scale.numel() != E
    rows = N if per_channel_quant else 1
    check(B_scale.numel() == E * rows and tuple(B_scale.shape[:2]) == (E, rows)[:B_scale.dim()],
          lambda: f"B_scale must be [{E}, {N}, 1] (per channel) or [{E}] (per tensor), got "
                  f"{tuple(B_scale.shape)}")
    check(A.dtype != FP8_DTYPE or A_scale.numel() in (1, A.shape[0] if per_channel_quant else 1),
          lambda: f"A_scale must hold one value{' or one per row' * per_channel_quant}, got "
                  f"{tuple(A_scale.shape)}")
    return per_channel_quant


def invoke_fused_moe_kernel(A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                            topk_weights: torch.Tensor | None,
                            sorted_token_ids: torch.Tensor | None, expert_ids: torch.Tensor,
                            num_tokens_post_padded: torch.Tensor | None,
                            mul_routed_weight: bool,
                            top_k: int, config: dict, silu_and_mul: bool = False, *,
                            use_fp8_w8a8: bool = False, A_scale: torch.Tensor | None = None,
                            B_scale: torch.Tensor | None = None,
                            block_shape: list[int] | None = None,
                            per_channel_quant: bool | None = None) -> None:
    """C[pair] = A[pair // top_k] @ B[expert]^T (x topk_weights[pair] if mul_routed_weight).

    silu_and_mul: B is a merged gate|up [E, 2N, K] and C[pair] = silu(gate) * up [N], the
    rounding of kernels/activation.py's silu_and_mul on the rounded products; a program
    covers BLOCK_SIZE_N // 2 gate rows and their up rows, the config's weight rows.

    A [M, K]; B [E, N, K] (last dim contiguous); C [M * top_k, N] or [M, top_k, N];
    topk_weights [M, top_k] fp32; sorted_token_ids / expert_ids / num_tokens_post_padded
    from moe_align_block_size, or sorted_token_ids None with expert_ids = topk_ids
    flattened (num_tokens_post_padded unused, may be None). `config` holds
    BLOCK_SIZE_M/N/K, GROUP_SIZE_M, num_warps, num_stages (engine get_config).

    use_fp8_w8a8: B fp8 with fp32 B_scale [E, cdiv(N, bn), cdiv(K, bk)] (block_shape
    [bn, bk]), [E, N, 1] (per channel) or [E] (per tensor); A fp8 with its A_scale, or a
    float A quantized here (quantize_moe_input: A_scale static, None dynamic; per token for
    per-channel B); C any float dtype. per_channel_quant None: from B_scale's shape."""
    check(A.dim() == 2 and B.dim() == 3 and A.shape[1] == B.shape[2],
          f"A [M, K] and B [E, N, K] do not match: {tuple(A.shape)}, {tuple(B.shape)}")
    if use_fp8_w8a8:
        per_channel_quant = _check_fp8(A, B, C, A_scale, B_scale, block_shape,
                                       per_channel_quant)
        if A.dtype != FP8_DTYPE:
            A, A_scale = quantize_moe_input(A, A_scale, per_channel_quant, block_shape)
    else:
        check_float("A", A)
        check(B.dtype == A.dtype and C.dtype == A.dtype,
              f"A, B and C must share a dtype, got {A.dtype}, {B.dtype}, {C.dtype}")
        check(A_scale is None and B_scale is None and block_shape is None,
              "A_scale, B_scale and block_shape are the FP8 path's (use_fp8_w8a8)")
    check_same_device(A=A, B=B, C=C, expert_ids=expert_ids)
    check(sorted_token_ids is None or num_tokens_post_padded is not None,
          "sorted_token_ids needs num_tokens_post_padded")
    check(B.stride(2) == 1, "B's last dimension must be contiguous")
    check(not (silu_and_mul and mul_routed_weight),
          "silu_and_mul is the gate|up projection's: no routed weight")
    M, N = A.shape[0], B.shape[1] // (2 if silu_and_mul else 1)
    num_tokens = M * top_k
    check(C.numel() == num_tokens * N and C.shape[-1] == N and C.is_contiguous(),
          f"C must be a contiguous [{num_tokens}, {N}] or [{M}, {top_k}, {N}]")
    c2 = C.view(num_tokens, N)
    check(not mul_routed_weight or (topk_weights is not None and topk_weights.is_contiguous()
                                    and topk_weights.numel() == num_tokens),
          "mul_routed_weight needs contiguous topk_weights of M * top_k values")
    if num_tokens == 0:
        return
    config = dict(config)
    config.pop("SPLIT_K", None)
    if silu_and_mul:
        config["BLOCK_SIZE_N"] = max(16, config["BLOCK_SIZE_N"] // 2)
    if use_fp8_w8a8 and block_shape is not None:
        # upstream's min(BLOCK_SIZE_K, min(block_shape[0], block_shape[1])): a K step
        # within one scale group (block_shape[1] wide)
        config["BLOCK_SIZE_K"] = min(config["BLOCK_SIZE_K"], block_shape[0], block_shape[1])
        check(block_shape[1] % config["BLOCK_SIZE_K"] == 0,
              lambda: f"BLOCK_SIZE_K {config['BLOCK_SIZE_K']} must divide block_shape[1]")
    bm = config["BLOCK_SIZE_M"]
    if sorted_token_ids is not None:
        EM = sorted_token_ids.shape[0]
        if M < bm:  # at most num_tokens non-empty experts, one block each
            EM = min(EM, num_tokens * bm)
    else:
        EM = num_tokens * bm
    grid = (triton.cdiv(EM, bm) * triton.cdiv(N, config["BLOCK_SIZE_N"]),)
    a_s, b_s, scale_strides = _scale_args(A_scale, B_scale, block_shape)
    fused_moe_kernel[grid](
        A, B, c2, a_s, b_s, topk_weights, sorted_token_ids, expert_ids,
        num_tokens_post_padded, N, B.shape[2], EM, num_tokens,
        A.stride(0), A.stride(1), B.stride(0), B.stride(2), B.stride(1),
        c2.stride(0), c2.stride(1), *scale_strides,
        group_n=block_shape[0] if block_shape else 0,
        group_k=block_shape[1] if block_shape else 0,
        naive_block_assignment=sorted_token_ids is None,
        MUL_ROUTED_WEIGHT=mul_routed_weight, top_k=top_k,
        compute_type=_COMPUTE_TYPES[C.dtype],
        DOT_PREC="ieee" if A.dtype == torch.float32 else "tf32", SILU_AND_MUL=silu_and_mul,
        use_fp8_w8a8=use_fp8_w8a8, per_channel_quant=bool(per_channel_quant),
        **config, **pdl_launch(A),
    )


def _scale_args(A_scale: torch.Tensor | None, B_scale: torch.Tensor | None,
                block_shape: list[int] | None) -> tuple:
    """(A scales, B scales, (stride_asm, stride_ask, stride_bse, stride_bsk, stride_bsn)):
    None and zeros without scales; a one-value A scale has row stride 0."""
    if B_scale is None:
        return None, None, (0, 0, 0, 0, 0)
    if block_shape is not None:
        return A_scale, B_scale, (A_scale.stride(0), A_scale.stride(1), B_scale.stride(0),
                                  B_scale.stride(2), B_scale.stride(1))
    a_s = A_scale.reshape(-1)  # [1] or [M], never 0-D (Triton: a scalar)
    return a_s, B_scale, (1 if a_s.numel() > 1 else 0, 0, B_scale.stride(0), 0,
                          B_scale.stride(1) if B_scale.dim() > 1 else 0)


def invoke_fused_moe_kernel_ref(A: torch.Tensor, B: torch.Tensor, topk_weights: torch.Tensor,
                                topk_ids: torch.Tensor, mul_routed_weight: bool, top_k: int
                                ) -> torch.Tensor:
    """What invoke_fused_moe_kernel writes, in fp32 rounded once: [M * top_k, N]."""
    rows = A.float().repeat_interleave(top_k, dim=0) if top_k > 1 else A.float()
    w = B.float()[topk_ids.reshape(-1)]  # [M * top_k, N, K]
    out = torch.einsum("pk,pnk->pn", rows, w)
    if mul_routed_weight:
        out = out * topk_weights.reshape(-1, 1).float()
    return out.to(A.dtype)
