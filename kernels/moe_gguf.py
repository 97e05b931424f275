"""The fused MoE grouped GEMM over raw GGUF expert blocks: GGUF MoE weights stay quantized.

fused_moe_kernel's routing (kernels/fused_moe.py: blocks of sorted_token_ids or one pair
per block, expert_ids per block, the routing weight in the fp32 epilogue, programs past
num_tokens_post_padded return) with kernels/gguf_gemm.py's fused dequantizing GEMM as the
tile loop: each step decodes a [BLOCK_N, 64-value] tile of the block's expert
(kernels/gguf_tiles.py dequant_tile) and feeds it to tl.dot. Upstream's GGUF MoE is CUDA
(vllm/model_executor/layers/quantization/gguf.py _fused_moe_gguf -> ops.ggml_moe_a8 /
ggml_moe_a8_vec, dequantize-per-expert beyond); this is the Triton counterpart with the
same weight layout: one GGUF tensor ffn_*_exps as [E, N, row_bytes] uint8. Offsets of
experts and rows are 64-bit; N, K and the block count come from the tensor's own shape.
Block sizes come from kernels/ggml_types.py; the tests' reference dequantizes the experts
with the engine's torch dequantize (engine/gguf/dequant.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from libvllm.kernels._common import check, check_float, check_same_device
from libvllm.kernels.ggml_types import GGML_TYPE_TRAITS, GGMLType
from libvllm.kernels.gguf_gemm import GGUF_MMQ_CONFIG
from libvllm.kernels.gguf_tiles import TILE_TYPES, dequant_tile

# kernels/gguf_gemm.py gguf_mmq's tile, in vLLM's keys
MOE_GGUF_CONFIG = {"BLOCK_SIZE_M": GGUF_MMQ_CONFIG.block_m, "BLOCK_SIZE_N": GGUF_MMQ_CONFIG.block_n,
                   "num_warps": GGUF_MMQ_CONFIG.num_warps,
                   "num_stages": GGUF_MMQ_CONFIG.num_stages}


@triton.jit
def fused_moe_gguf_kernel(
    a_ptr, w_ptr, c_ptr, topk_weights_ptr, sorted_token_ids_ptr, expert_ids_ptr,
    num_tokens_post_padded_ptr, N, K, nblk, num_valid_tokens,
    stride_am: tl.int64, stride_we: tl.int64, stride_wn: tl.int64, stride_cm: tl.int64,
    naive_block_assignment: tl.constexpr, BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr, MUL_ROUTED_WEIGHT: tl.constexpr, top_k: tl.constexpr,
    TYPE: tl.constexpr, NB: tl.constexpr, PARTS: tl.constexpr, W: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    # A [M, K]; W [E, N, row_bytes] raw blocks; C rows = pairs, N columns (stride_cm apart)
    pid_m = tl.program_id(0)
    offs = tl.arange(0, BLOCK_SIZE_M).to(tl.int64)
    if not naive_block_assignment:
        if pid_m * BLOCK_SIZE_M >= tl.load(num_tokens_post_padded_ptr):
            return
        offs_token = tl.load(sorted_token_ids_ptr + pid_m * BLOCK_SIZE_M + offs)
    else:
        offs_token = tl.where(offs == 0, pid_m, num_valid_tokens)
    offs_token = offs_token.to(tl.int64)
    token_mask = offs_token < num_valid_tokens
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    n = tl.program_id(1) * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    n_mask = (n < N)[:, None, None]
    rows = w_ptr + expert * stride_we + n.to(tl.int64)[:, None, None] * stride_wn
    a_rows = a_ptr + (offs_token // top_k)[:, None, None] * stride_am
    m_mask = token_mask[:, None, None]
    acc = tl.zeros([BLOCK_SIZE_M, BLOCK_SIZE_N], dtype=tl.float32)
    for blk0 in range(0, nblk, NB):
        for part in tl.static_range(PARTS):
            q, scale, off, k = dequant_tile(TYPE, rows, blk0, nblk, n_mask, NB, part, W)
            x = tl.load(a_rows + k[None], mask=m_mask & (k < K)[None], other=0.0)  # [BM, P, W]
            w = q * scale + off  # [BN, P, W]
            w2 = tl.reshape(w, (BLOCK_SIZE_N, w.shape[1] * W)).to(x.dtype)
            x2 = tl.reshape(x, (BLOCK_SIZE_M, w.shape[1] * W))
            acc = tl.dot(x2, tl.trans(w2), acc, input_precision=DOT_PREC)
    if MUL_ROUTED_WEIGHT:
        acc *= tl.load(topk_weights_ptr + offs_token, mask=token_mask, other=0)[:, None]
    c = c_ptr + offs_token[:, None] * stride_cm + n[None, :]
    tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=token_mask[:, None] & (n < N)[None, :])


def check_expert_blocks(qweight: torch.Tensor, qtype: int) -> tuple[int, int, int]:
    """Validate [E, N, row_bytes] uint8 expert blocks -> (N, K, blocks per row)."""
    check(qtype in TILE_TYPES, f"GGUF Triton kernels do not support GGML type {qtype}")
    block, type_size = GGML_TYPE_TRAITS[GGMLType(qtype)]
    check(qweight.dtype == torch.uint8 and qweight.dim() == 3 and qweight.is_contiguous(),
          f"expert blocks must be a contiguous [E, N, row_bytes] uint8 tensor, got "
          f"{tuple(qweight.shape)} {qweight.dtype}")
    check(qweight.shape[2] % type_size == 0 and qweight.shape[2] % 2 == 0,
          f"row of {qweight.shape[2]} bytes is not whole {type_size}-byte blocks")
    nblk = qweight.shape[2] // type_size
    return qweight.shape[1], nblk * block, nblk


def invoke_fused_moe_gguf_kernel(A: torch.Tensor, qweight: torch.Tensor, qtype: int,
                                 C: torch.Tensor, topk_weights: torch.Tensor,
                                 sorted_token_ids: torch.Tensor | None,
                                 expert_ids: torch.Tensor,
                                 num_tokens_post_padded: torch.Tensor | None,
                                 mul_routed_weight: bool, top_k: int,
                                 config: dict | None = None) -> None:
    """C[pair] = A[pair // top_k] @ dequant(qweight[expert])^T (x weight): as
    invoke_fused_moe_kernel, with qweight [E, N, row_bytes] raw GGUF blocks. C is
    [M * top_k, N] with a contiguous last dim (a column slice of a wider buffer is fine)."""
    n, k, nblk = check_expert_blocks(qweight, qtype)
    check_float("A", A)
    check(A.dim() == 2 and A.shape[1] == k and A.stride(1) == 1,
          f"A must be [M, {k}] with a contiguous last dimension, got {tuple(A.shape)}")
    check_same_device(A=A, qweight=qweight, C=C, expert_ids=expert_ids)
    check(sorted_token_ids is None or num_tokens_post_padded is not None,
          "sorted_token_ids needs num_tokens_post_padded")
    num_tokens = A.shape[0] * top_k
    check(C.dim() == 2 and tuple(C.shape) == (num_tokens, n) and C.stride(1) == 1
          and C.dtype == A.dtype, f"C must be [{num_tokens}, {n}] {A.dtype}")
    if num_tokens == 0:
        return
    cfg = {**MOE_GGUF_CONFIG, **(config or {})}
    bm = cfg["BLOCK_SIZE_M"]
    if sorted_token_ids is None:
        em = num_tokens * bm
    else:
        em = sorted_token_ids.shape[0]
        em = min(em, num_tokens * bm) if A.shape[0] < bm else em
    nb = {32: 4 if TILE_TYPES[qtype][1] == 2 else 2, 256: 1}[TILE_TYPES[qtype][0]]
    fused_moe_gguf_kernel[(triton.cdiv(em, bm), triton.cdiv(n, cfg["BLOCK_SIZE_N"]))](
        A, qweight, C, topk_weights, sorted_token_ids, expert_ids, num_tokens_post_padded,
        n, k, nblk, num_tokens, A.stride(0), qweight.stride(0), qweight.stride(1),
        C.stride(0), naive_block_assignment=sorted_token_ids is None, BLOCK_SIZE_M=bm,
        BLOCK_SIZE_N=cfg["BLOCK_SIZE_N"], MUL_ROUTED_WEIGHT=mul_routed_weight, top_k=top_k,
        TYPE=qtype, NB=nb, PARTS=TILE_TYPES[qtype][1], W=TILE_TYPES[qtype][3],
        DOT_PREC="ieee" if A.dtype == torch.float32 else "tf32",
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )

