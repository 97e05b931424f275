"""Write this step's K/V rows into the paged KV cache at their slots, in Triton.

Mirrors vllm/v1/attention/ops/triton_reshape_and_cache_flash.py (reshape_and_cache_flash, the
NHD layout): one program per (token, tile of heads*head_size) copies its key and value row to
slot = block_id * block_size + offset. The cache is the engine's single tensor
[2, num_blocks, block_size, num_kv_heads, head_size] (engine/layers/attention.py). A negative
slot (vLLM's PAD_SLOT_ID = -1, padding rows of a CUDA-graph batch) is skipped. Offsets are
64-bit: one layer's cache can exceed 2^31 elements.

An fp8 cache (torch.float8_e4m3fn, vLLM's --kv-cache-dtype fp8) stores each element as
vLLM's FP8_KV_CACHE store: x / scale in fp32 with the layer's per-tensor k_scale or v_scale
(one-element float32 device tensors: no host sync, CUDA-graph safe), saturated to the
format's +-448 (the cvt.rn.satfinite cast of vLLM's store) and rounded to nearest even;
quantize_kv / quantize_kv_ref are that rule, dequantize_kv_ref its inverse (fp8 * scale).

Precondition: slot_mapping < num_blocks * block_size (the KV cache manager allocates slots).
reshape_and_cache_ref is the engine's torch path (engine/layers/attention.py
reshape_and_cache) in plain torch; tests/test_kernels_reshape_and_cache.py checks they agree.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from libvllm.kernels._common import (
    cdiv,
    check,
    check_float,
    check_same_device,
    next_pow2,
    pdl_launch,
    pdl_wait,
)
from libvllm.kernels.launch_cache import cached_launch

FP8_KV_DTYPE = torch.float8_e4m3fn  # vLLM's fp8 / fp8_e4m3 KV cache
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max: the store saturates there
KV_CACHE_DTYPES = (torch.float32, torch.float16, torch.bfloat16, FP8_KV_DTYPE)


@triton.jit
def quantize_kv_value(x, scale):
    """x / scale (fp32, IEEE division) saturated to +-448: the value an fp8 cache store
    takes, its cast rounding it to e4m3."""
    return tl.minimum(tl.maximum(tl.div_rn(x.to(tl.float32), scale), -448.0), 448.0)


@triton.jit
def quantize_kv(x, scale_ptr, FP8: tl.constexpr):
    """x as a KV-cache store takes it: with FP8, quantize_kv_value with the scale at
    scale_ptr; else x unchanged."""
    y = x
    if FP8:  # a constexpr branch: y may change type (one return, one type)
        y = quantize_kv_value(x, tl.load(scale_ptr))
    return y


def check_kv_cache_dtype(kv_cache: torch.Tensor, k_scale: torch.Tensor | None,
                         v_scale: torch.Tensor | None) -> bool:
    """Whether kv_cache is fp8 (then k_scale and v_scale must be one-element float32
    tensors on its device); a float cache ignores them."""
    check(kv_cache.dtype in KV_CACHE_DTYPES, lambda: "kv_cache must be float32, float16, "
          f"bfloat16 or float8_e4m3fn, got {kv_cache.dtype}")
    if kv_cache.dtype != FP8_KV_DTYPE:
        return False
    for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        check(s is not None and s.numel() == 1 and s.dtype == torch.float32
              and s.device == kv_cache.device, lambda name=name: f"an fp8 kv_cache needs "
              f"{name} as a one-element float32 tensor on {kv_cache.device}")
    return True


def quantize_kv_ref(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x (any float) -> float8_e4m3fn: x / scale in fp32, saturated to +-448, rounded."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_KV_DTYPE)


def dequantize_kv_ref(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype
                      ) -> torch.Tensor:
    """An fp8 cache read: x * scale in fp32, rounded to dtype."""
    return (x.float() * scale).to(dtype)


@cached_launch
@triton.jit
def _reshape_and_cache_kernel(
    k_ptr, v_ptr, cache_ptr, slot_ptr, k_scale_ptr, v_scale_ptr,
    stride_kt: tl.int64, stride_vt: tl.int64, stride_kv: tl.int64,
    stride_block: tl.int64, stride_slot: tl.int64, row_size, block_size,
    TILE: tl.constexpr, FP8: tl.constexpr, USE_PDL: tl.constexpr,
):
    if USE_PDL:  # the kernel before wrote this one's inputs
        pdl_wait()
    # k, v rows: [num_kv_heads * head_size] (heads contiguous); cache slot rows likewise
    tok = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    if slot < 0:
        return
    cols = tl.program_id(1) * TILE + tl.arange(0, TILE)
    mask = cols < row_size
    dst = cache_ptr + (slot // block_size) * stride_block + (slot % block_size) * stride_slot
    k = quantize_kv(tl.load(k_ptr + tok * stride_kt + cols, mask=mask), k_scale_ptr, FP8)
    v = quantize_kv(tl.load(v_ptr + tok * stride_vt + cols, mask=mask), v_scale_ptr, FP8)
    tl.store(dst + cols, k.to(cache_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + stride_kv + cols, v.to(cache_ptr.dtype.element_ty), mask=mask)


def _check_rows(name: str, t: torch.Tensor, n: int, nkv: int, hd: int) -> None:
    check_float(name, t)
    check(t.shape == (n, nkv, hd) and t.stride(2) == 1 and t.stride(1) == hd,
          lambda: f"{name} must be [{n}, {nkv}, {hd}] with contiguous heads, got {tuple(t.shape)} "
          f"strides {t.stride()}")


def reshape_and_cache(
    key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
) -> None:
    """key, value: [T, nkv, hd]; kv_cache: [2, num_blocks, block_size, nkv, hd]; slots: [T];
    k_scale, v_scale: [1] float32, read only with an fp8 cache."""
    check(kv_cache.dim() == 5 and kv_cache.shape[0] == 2,
          lambda: "kv_cache must be [2, num_blocks, "
          f"block_size, num_kv_heads, head_size], got {tuple(kv_cache.shape)}")
    fp8 = check_kv_cache_dtype(kv_cache, k_scale, v_scale)
    _, _, block_size, nkv, hd = kv_cache.shape
    check(kv_cache.stride(4) == 1 and kv_cache.stride(3) == hd,
          "kv_cache's head and feature dimensions must be contiguous")
    check(slot_mapping.dim() == 1 and slot_mapping.dtype in (torch.int32, torch.int64),
          "slot_mapping must be a 1-D int32/int64 tensor")
    n = slot_mapping.shape[0]
    _check_rows("key", key, n, nkv, hd)
    _check_rows("value", value, n, nkv, hd)
    check_same_device(key=key, value=value, kv_cache=kv_cache, slot_mapping=slot_mapping)
    if n == 0:
        return
    row = nkv * hd
    tile = min(2048, next_pow2(row))
    _reshape_and_cache_kernel[(n, cdiv(row, tile))](
        key, value, kv_cache, slot_mapping, k_scale if fp8 else None,
        v_scale if fp8 else None, key.stride(0), value.stride(0), kv_cache.stride(0),
        kv_cache.stride(1), kv_cache.stride(2), row, block_size, TILE=tile, FP8=fp8,
        num_warps=4 if tile >= 512 else 1,
        **pdl_launch(key),
    )


def reshape_and_cache_ref(
    key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
) -> None:
    """The engine's torch path (engine/layers/attention.py reshape_and_cache), padding skipped:
    key, value [T, nkv, hd] copied into kv_cache [2, num_blocks, block_size, nkv, hd]
    (quantize_kv_ref'd with k_scale / v_scale into an fp8 cache)."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    k, v = key[keep], value[keep]
    if kv_cache.dtype == FP8_KV_DTYPE:  # the bytes
        k = quantize_kv_ref(k, k_scale).view(torch.uint8)
        v = quantize_kv_ref(v, v_scale).view(torch.uint8)
        kv_cache = kv_cache.view(torch.uint8)
    # by block and offset: the cache may be a strided view of a block pool
    blocks, offsets = slots // kv_cache.shape[2], slots % kv_cache.shape[2]
    kv_cache[0, blocks, offsets] = k.to(kv_cache.dtype)
    kv_cache[1, blocks, offsets] = v.to(kv_cache.dtype)
