"""Dequantization of GGML tensor blocks to float, in pure torch (runs on CPU and CUDA tensors).

Mirrors the dequantize_row_* functions of llama.cpp ggml/src/ggml-quants.c. Each kernel takes
the raw bytes viewed as [n_blocks, type_size] uint8 and returns [n_blocks, block_size] float32,
vectorized over blocks: fields are byte slices, packed bits are unpacked with shifts and masks,
and the float arithmetic is done in the same order as the reference so results are bit-exact
with gguf.quants.dequantize (the gguf package's numpy port of ggml-quants.c). The
importance-matrix, ternary and MXFP4 types (GGUF_PY_TYPES), which have no GGUF kernel here and
are only dequantized at load, go through gguf.quants itself on the host
(.agents/specs/gguf-iq-dequant.md).
"""

from collections.abc import Callable

import gguf.quants
import numpy as np
import torch

from libvllm.engine.errors import InvalidArgumentError, UnsupportedError
from libvllm.engine.gguf.constants import GGML_TYPE_TRAITS, QK_K, GGMLType

# Blocks are dequantized in chunks of about this many elements to bound temporaries.
_CHUNK_ELEMENTS = 1 << 24


def _reinterpret(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[n, k] uint8 byte field -> [n, k / itemsize] `dtype` (copies: fields are strided)."""
    return x.contiguous().view(dtype)


def _f16(blocks: torch.Tensor, at: int) -> torch.Tensor:
    """The fp16 scalar at byte `at` of each block, as [n, 1] float32."""
    return _reinterpret(blocks[:, at : at + 2], torch.float16).float()


def _unpack(x: torch.Tensor, shifts: range, mask: int) -> torch.Tensor:
    """[..., k] uint8 -> [..., len(shifts), k]: the bit fields (x >> shift) & mask."""
    s = torch.tensor(list(shifts), dtype=torch.uint8, device=x.device).view(-1, 1)
    return (x.unsqueeze(-2) >> s) & mask


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[n, k] uint8 -> [n, 2k]: the k low nibbles, then the k high nibbles."""
    return _unpack(qs, range(0, 8, 4), 0x0F).flatten(-2)


def _bits(qh: torch.Tensor) -> torch.Tensor:
    """[n, 4] uint8 (a little-endian uint32) -> [n, 32] uint8, element j = bit j."""
    return _unpack(qh, range(8), 1).transpose(-1, -2).flatten(-2)


def _f32(blocks: torch.Tensor) -> torch.Tensor:
    return _reinterpret(blocks, torch.float32)


def _f16_plain(blocks: torch.Tensor) -> torch.Tensor:
    return _reinterpret(blocks, torch.float16).float()


def _bf16(blocks: torch.Tensor) -> torch.Tensor:
    return _reinterpret(blocks, torch.bfloat16).float()


def _q4_0(blocks: torch.Tensor) -> torch.Tensor:
    # block: d fp16 | qs[16] (4-bit, offset 8)
    d = _f16(blocks, 0)  # [n, 1]
    q = _nibbles(blocks[:, 2:18]).float() - 8  # [n, 32]
    return d * q


def _q4_1(blocks: torch.Tensor) -> torch.Tensor:
    # block: d fp16 | m fp16 | qs[16] (4-bit)
    d, m = _f16(blocks, 0), _f16(blocks, 2)  # [n, 1]
    q = _nibbles(blocks[:, 4:20]).float()  # [n, 32]
    return d * q + m


def _q5(qh: torch.Tensor, qs: torch.Tensor) -> torch.Tensor:
    """5-bit values: low nibbles from qs [n, 16], fifth bits from qh [n, 4] -> [n, 32] float."""
    return (_nibbles(qs) | (_bits(qh) << 4)).float()


def _q5_0(blocks: torch.Tensor) -> torch.Tensor:
    # block: d fp16 | qh[4] | qs[16] (5-bit, offset 16)
    d = _f16(blocks, 0)  # [n, 1]
    return d * (_q5(blocks[:, 2:6], blocks[:, 6:22]) - 16)


def _q5_1(blocks: torch.Tensor) -> torch.Tensor:
    # block: d fp16 | m fp16 | qh[4] | qs[16] (5-bit)
    d, m = _f16(blocks, 0), _f16(blocks, 2)  # [n, 1]
    return d * _q5(blocks[:, 4:8], blocks[:, 8:24]) + m


def _q8_0(blocks: torch.Tensor) -> torch.Tensor:
    # block: d fp16 | qs[32] int8
    d = _f16(blocks, 0)  # [n, 1]
    return _reinterpret(blocks[:, 2:34], torch.int8).float() * d


def _q2_k(blocks: torch.Tensor) -> torch.Tensor:
    # block: scales[16] (low nibble scale, high nibble min) | qs[64] (2-bit) | d fp16 | dmin fp16
    n = blocks.shape[0]
    scales = blocks[:, :16]
    d, dmin = _f16(blocks, 80), _f16(blocks, 82)  # [n, 1]
    dl = (d * (scales & 0x0F).float()).view(n, 16, 1)
    ml = (dmin * (scales >> 4).float()).view(n, 16, 1)
    # two 32-byte halves, each holding 4 bit planes of 32 values: [n, 2, 4, 32] -> [n, 16, 16]
    q = _unpack(blocks[:, 16:80].reshape(n, 2, 32), range(0, 8, 2), 0x03).reshape(n, 16, 16)
    return (dl * q.float() - ml).view(n, QK_K)


def _q3_k_scales(packed: torch.Tensor) -> torch.Tensor:
    """[n, 12] uint8 of 16 packed 6-bit scales -> [n, 16] float32 (signed, offset 32)."""
    low = _unpack(packed[:, :8], range(0, 8, 4), 0x0F).flatten(-2)  # [n, 16]
    high = _unpack(packed[:, 8:12], range(0, 8, 2), 0x03).flatten(-2)  # [n, 16]
    return (low | (high << 4)).float() - 32


def _q3_k(blocks: torch.Tensor) -> torch.Tensor:
    # block: hmask[32] | qs[64] (low 2 bits) | scales[12] (6-bit) | d fp16
    n = blocks.shape[0]
    d = _f16(blocks, 108)  # [n, 1]
    dl = (d * _q3_k_scales(blocks[:, 96:108])).view(n, 16, 1)
    low = _unpack(blocks[:, 32:96].reshape(n, 2, 32), range(0, 8, 2), 0x03)  # [n, 2, 4, 32]
    high = _unpack(blocks[:, :32], range(8), 1)  # [n, 8, 32]
    # a cleared hmask bit subtracts 4
    q = low.reshape(n, 16, 16).float() - ((high ^ 1) << 2).reshape(n, 16, 16).float()
    return (dl * q).view(n, QK_K)


def _k_scale_min(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[n, 12] uint8 of 8 packed 6-bit (scale, min) pairs -> two [n, 8, 1] float32."""
    sc_lo, mn_lo, hi = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]  # [n, 4] each
    sc = torch.cat([sc_lo & 0x3F, (hi & 0x0F) | ((sc_lo >> 2) & 0x30)], dim=-1)
    mn = torch.cat([mn_lo & 0x3F, (hi >> 4) | ((mn_lo >> 2) & 0x30)], dim=-1)
    return sc.float().unsqueeze(-1), mn.float().unsqueeze(-1)


def _k_low_nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[n, 128] uint8 -> [n, 8, 32]: each 32-byte chunk yields 32 low then 32 high nibbles."""
    return _unpack(qs.reshape(qs.shape[0], 4, 32), range(0, 8, 4), 0x0F).reshape(-1, 8, 32)


def _q4_k(blocks: torch.Tensor) -> torch.Tensor:
    # block: d fp16 | dmin fp16 | scales[12] | qs[128] (4-bit)
    n = blocks.shape[0]
    d, dmin = _f16(blocks, 0).unsqueeze(-1), _f16(blocks, 2).unsqueeze(-1)  # [n, 1, 1]
    sc, mn = _k_scale_min(blocks[:, 4:16])  # [n, 8, 1]
    q = _k_low_nibbles(blocks[:, 16:144]).float()  # [n, 8, 32]
    return ((d * sc) * q - dmin * mn).view(n, QK_K)


def _q5_k(blocks: torch.Tensor) -> torch.Tensor:
    # block: d fp16 | dmin fp16 | scales[12] | qh[32] (fifth bits) | qs[128] (low 4 bits)
    n = blocks.shape[0]
    d, dmin = _f16(blocks, 0).unsqueeze(-1), _f16(blocks, 2).unsqueeze(-1)  # [n, 1, 1]
    sc, mn = _k_scale_min(blocks[:, 4:16])  # [n, 8, 1]
    high = _unpack(blocks[:, 16:48], range(8), 1)  # [n, 8, 32]
    q = (_k_low_nibbles(blocks[:, 48:176]) | (high << 4)).float()  # [n, 8, 32]
    return ((d * sc) * q - dmin * mn).view(n, QK_K)


def _q6_k(blocks: torch.Tensor) -> torch.Tensor:
    # block: ql[128] (low 4 bits) | qh[64] (high 2 bits) | scales[16] int8 | d fp16
    n = blocks.shape[0]
    d = _f16(blocks, 208)  # [n, 1]
    scales = _reinterpret(blocks[:, 192:208], torch.int8).float()  # [n, 16]
    dl = (d * scales).view(n, 16, 1)
    # two 128-value halves; ql: 64 bytes x {low, high} nibble, qh: 32 bytes x 4 bit pairs
    low = _unpack(blocks[:, :128].reshape(n, 2, 64), range(0, 8, 4), 0x0F)  # [n, 2, 2, 64]
    high = _unpack(blocks[:, 128:192].reshape(n, 2, 32), range(0, 8, 2), 0x03)  # [n, 2, 4, 32]
    q = low.reshape(n, 8, 32) | (high.reshape(n, 8, 32) << 4)
    return (dl * (q.float() - 32).view(n, 16, 16)).view(n, QK_K)


def _q8_k(blocks: torch.Tensor) -> torch.Tensor:
    # block: d fp32 | qs[256] int8 | bsums[16] int16 (unused here)
    d = _reinterpret(blocks[:, 0:4], torch.float32)  # [n, 1]
    return d * _reinterpret(blocks[:, 4:260], torch.int8).float()


_KERNELS: dict[GGMLType, Callable[[torch.Tensor], torch.Tensor]] = {
    GGMLType.F32: _f32,
    GGMLType.F16: _f16_plain,
    GGMLType.BF16: _bf16,
    GGMLType.Q4_0: _q4_0,
    GGMLType.Q4_1: _q4_1,
    GGMLType.Q5_0: _q5_0,
    GGMLType.Q5_1: _q5_1,
    GGMLType.Q8_0: _q8_0,
    GGMLType.Q2_K: _q2_k,
    GGMLType.Q3_K: _q3_k,
    GGMLType.Q4_K: _q4_k,
    GGMLType.Q5_K: _q5_k,
    GGMLType.Q6_K: _q6_k,
    GGMLType.Q8_K: _q8_k,
}

GGUF_PY_TYPES = (GGMLType.IQ2_XXS, GGMLType.IQ2_XS, GGMLType.IQ2_S, GGMLType.IQ3_XXS,
                 GGMLType.IQ3_S, GGMLType.IQ1_S, GGMLType.IQ1_M, GGMLType.IQ4_NL,
                 GGMLType.IQ4_XS, GGMLType.TQ1_0, GGMLType.TQ2_0, GGMLType.MXFP4)


def _gguf_py(ggml_type: GGMLType) -> Callable[[torch.Tensor], torch.Tensor]:
    """A kernel over gguf.quants.dequantize: blocks to the host and back as float32."""
    qtype = gguf.GGMLQuantizationType(int(ggml_type))

    def kernel(blocks: torch.Tensor) -> torch.Tensor:
        # one row of all the blocks: gguf.quants loops in Python over groups of 16 rows
        raw = blocks.cpu().numpy().reshape(1, -1)  # [1, n * type_size]
        with np.errstate(all="ignore"):  # inf / NaN scales give inf / NaN, as in ggml
            out = gguf.quants.dequantize(raw, qtype)  # [1, n * block_size]
        return torch.from_numpy(out).view(blocks.shape[0], -1).to(blocks.device)
    return kernel


_KERNELS.update({t: _gguf_py(t) for t in GGUF_PY_TYPES})
SUPPORTED_TYPES: frozenset[int] = frozenset(_KERNELS)


def _type_name(ggml_type: int) -> str:
    try:
        return GGMLType(ggml_type).name
    except ValueError:
        return f"#{ggml_type}"


def dequantize(
    raw: torch.Tensor, ggml_type: int, n_elements: int, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """[nbytes] uint8 raw GGML blocks -> [n_elements] `dtype` (float32 by default).

    Runs on raw's device. The result never aliases `raw` (safe when raw views a read-only
    mmap). Raises UnsupportedError for types without a kernel, InvalidArgumentError when
    raw's size does not match n_elements.
    """
    kernel = _KERNELS.get(ggml_type)
    if kernel is None:
        raise UnsupportedError(f"dequantizing GGML type {_type_name(ggml_type)} is not supported")
    block_size, type_size = GGML_TYPE_TRAITS[GGMLType(ggml_type)]
    n_blocks, rem = divmod(n_elements, block_size)
    if raw.dtype != torch.uint8 or raw.dim() != 1 or rem or raw.numel() != n_blocks * type_size:
        raise InvalidArgumentError(
            f"{_type_name(ggml_type)}: {n_elements} elements need {n_blocks * type_size} "
            f"bytes in whole blocks of {block_size}, got {tuple(raw.shape)} {raw.dtype}"
        )
    blocks = raw.view(n_blocks, type_size)  # [n_blocks, type_size]
    out = torch.empty(n_blocks, block_size, dtype=dtype, device=raw.device)
    chunk = max(1, _CHUNK_ELEMENTS // block_size)
    for start in range(0, n_blocks, chunk):
        out[start : start + chunk] = kernel(blocks[start : start + chunk])
    return out.view(n_elements)


def dequantize_rows(raw: torch.Tensor, ggml_type: int,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[..., row_bytes] uint8 rows of GGML blocks -> [..., K] `dtype` (dequantize per row)."""
    block_size, type_size = GGML_TYPE_TRAITS[GGMLType(ggml_type)]
    k = raw.shape[-1] // type_size * block_size
    out = dequantize(raw.contiguous().view(-1), ggml_type, raw.numel() // type_size * block_size,
                     dtype)
    return out.view(*raw.shape[:-1], k)
