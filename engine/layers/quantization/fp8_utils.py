"""FP8 tensor math: dequantization of the checkpoint layouts, the online per-tensor
quantizer, the block-shape checks, and the CUDA matmuls on kernels/.

Mirrors vllm/model_executor/layers/quantization/utils/fp8_utils.py (validate_fp8_block_shape,
validate_fp8_block_shape_moe, apply_w8a8_block_fp8_linear) and utils/w8a8_utils.py
(requantize_with_max_scale, the per-tensor / per-channel fp8 linear: per-token dynamic or
static per-tensor activations, weight scale [N, 1] or one value) and
online/fp8.py (per-tensor weight scale amax / 448). Dequantization is exact fp32 math:
weight[n, k] * scale_inv[n // bn, k // bk] (block), * scale[n] (channel), * the shard's
scale (tensor). The CUDA matmuls import kernels/fp8_quant.py, kernels/fp8_block_gemm.py and
kernels/fp8_scaled_mm.py lazily (CUDA only).
"""

from __future__ import annotations

import torch

from libvllm.engine.errors import ModelLoadError
from libvllm.engine.layers.quantization.base_config import FP8_MAX, WeightScheme


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def dequant_block(w: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int]
                  ) -> torch.Tensor:
    """w [..., N, K] fp8, scale_inv [..., ceil(N/bn), ceil(K/bk)] -> fp32 [..., N, K]."""
    bn, bk = block
    n, k = w.shape[-2:]
    s = scale_inv.float().repeat_interleave(bn, -2).repeat_interleave(bk, -1)
    return w.float() * s[..., :n, :k]


def dequant_rows(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """w [..., N, K] fp8 times a per-row scale [..., N] -> fp32 [..., N, K]."""
    return w.float() * scale.float().unsqueeze(-1)


def shard_row_scales(scale: torch.Tensor, widths: list[int]) -> torch.Tensor:
    """Per-shard scales [..., S] -> per-row [..., sum(widths)] (vLLM's logical widths)."""
    return scale.float().repeat_interleave(torch.tensor(widths, device=scale.device), dim=-1)


def dequantize_checkpoint_weight(w: torch.Tensor) -> torch.Tensor:
    """fp32 of an fp8 checkpoint weight with its attached scale (a dense layer's)."""
    scheme: WeightScheme = w.fp8_scheme  # attached by engine/model_loader/fp8_weights.py
    scale = w.fp8_scales[scheme.scale_name]
    if scheme.kind == "block":
        return dequant_block(w, scale, scheme.block)
    return dequant_rows(w, scale.reshape(-1).expand(w.shape[0]))


def quantize_per_tensor(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's online per-tensor FP8: scale = amax / 448 (fp32), q = clamp(w / scale)."""
    # w: [..., N, K] -> (q fp8 [..., N, K], scale fp32 [1])
    scale = (w.abs().amax().float() / FP8_MAX).clamp_min(1e-12).reshape(1)
    q = (w.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale


def requantize_with_max_scale(w: torch.Tensor, scale: torch.Tensor, widths: list[int]
                              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Shards of a merged layer with one scale each -> one weight under their max scale."""
    # w: [N, K] fp8, scale: [S] -> (w fp8 [N, K], scale [1])
    max_scale = scale.float().max().reshape(1)
    dense = dequant_rows(w, shard_row_scales(scale, widths))
    return (dense / max_scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), max_scale


def validate_fp8_block_shape(prefix: str, widths: list[int], input_size: int, tp: int,
                             row_split: bool, block: tuple[int, int]) -> None:
    """vLLM's check: shards of a merged or column-split layer (but the last of an unsplit
    merged one) fill whole block_n rows; a row-split input is whole block_k columns."""
    bn, bk = block
    if tp > 1 and row_split and input_size % bk:
        raise ModelLoadError(f"{prefix}: Weight input_size_per_partition = {input_size} is "
                             f"not divisible by weight quantization block_k = {bk}.")
    column_split = tp > 1 and not row_split
    check = widths if column_split else widths[:-1]
    for w in check:
        if w % bn:
            raise ModelLoadError(f"{prefix}: Weight output_partition_size = {w} is not "
                                 f"divisible by weight quantization block_n = {bn}.")


def validate_fp8_block_shape_moe(prefix: str, intermediate: int, tp: int,
                                 block: tuple[int, int]) -> None:
    bn, bk = block
    if intermediate % bn:
        raise ModelLoadError(f"{prefix}: The output_size of gate's and up's weight = "
                             f"{intermediate} is not divisible by weight quantization "
                             f"block_n = {bn}.")
    if tp > 1 and intermediate % bk:
        raise ModelLoadError(f"{prefix}: The input_size of down's weight = {intermediate} "
                             f"is not divisible by weight quantization block_k = {bk}.")


def apply_fp8_linear(scheme: WeightScheme, x: torch.Tensor, weight: torch.Tensor,
                     scale: torch.Tensor, input_scale: torch.Tensor | None,
                     bias: torch.Tensor | None) -> torch.Tensor:
    """CUDA: x [M, K] bf16/fp16 @ weight [N, K] fp8 -> [M, N] in x's dtype.
    block: per-token-group activation scales, then _apply_block_fp8's kernel (vLLM's
    apply_w8a8_block_fp8_linear); channel / tensor: per-token dynamic (or the static
    per-tensor input_scale) activations and kernels/fp8_scaled_mm.py."""
    from libvllm.kernels.fp8_quant import scaled_fp8_quant  # lazy: CUDA

    x = x.contiguous()  # [M, K]
    if scheme.kind == "block":
        out = _apply_block_fp8(scheme.block, x, weight, scale)
        return out if bias is None else out + bias
    from libvllm.kernels.fp8_scaled_mm import fp8_scaled_mm

    if input_scale is not None:
        x_q, x_s = scaled_fp8_quant(x, input_scale)  # static per-tensor
    else:
        x_q, x_s = scaled_fp8_quant(x, None, use_per_token_if_dynamic=True)  # [M, 1]
    w_s = scale.view(-1, 1) if scale.numel() > 1 else scale  # [N, 1] per channel, or [1]
    return fp8_scaled_mm(x_q, weight, x_s, w_s, x.dtype, bias)


def _apply_block_fp8(block: tuple[int, int], x: torch.Tensor, weight: torch.Tensor,
                     scale: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ block-FP8 weight [N, K] -> [M, N]: one row on the GEMV
    (kernels/fp8_gemv.py, inside w8a8_block_fp8_matmul), more on cuBLASLt's block-scaled
    GEMM where it takes the shape, else the Triton GEMM (vLLM's dispatch order in
    W8A8BlockFp8LinearOp: CUTLASS, then Triton)."""
    from libvllm.kernels.fp8_block_gemm import w8a8_block_fp8_matmul
    from libvllm.kernels.fp8_quant import per_token_group_quant_fp8
    from libvllm.kernels.fp8_scaled_mm import (
        BLOCK_ROWS,
        block_scaled_mm_supported,
        fp8_block_scaled_mm,
    )

    m = x.shape[0]
    if m > 1 and block_scaled_mm_supported(x, weight, block):
        x_q, x_s = per_token_group_quant_fp8(x, block[1], column_major_scales=True,
                                             row_multiple=BLOCK_ROWS)  # [Mp, K], [Mp, K/bk]
        return fp8_block_scaled_mm(x_q, weight, x_s, scale, x.dtype)[:m]
    x_q, x_s = per_token_group_quant_fp8(x, block[1])  # [M, K], [M, K / bk]
    return w8a8_block_fp8_matmul(x_q, weight, x_s, scale, list(block), x.dtype)
