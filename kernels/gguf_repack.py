"""Load-time repack of GGUF blocks into the layout the decode GEMV streams (gguf_packed.py).

Raw GGUF rows ([N, row_bytes] uint8, llama.cpp's block_q4_0 / q8_0 / q4_K / q5_K / q6_K,
read as engine/gguf/dequant.py reads them) become a few integer planes per row, every one
K-major so that one program's lanes read consecutive 16-byte words. Values are grouped by
32 along K (group g = k // 32, i = k % 32); within a group of 4-bit values word l (of 4)
holds value i = 4 * s + l in its nibble slot s (bits 4s..4s+3), and for Q8_0 word l (of 8)
holds value i = 8 * s + l in byte s, stored offset by 128 (unsigned). So slots s and
s + 4 (s and s + 2 for bytes) of a word sit 16 bits apart: one shift and one mask move both
into the mantissas of an fp16 pair (1 + q / 2^bits), the GEMV's decode step. Planes:

- qs: int32 [N, G * 4] low 4 bits (Q4_0, Q4_K, Q5_K, Q6_K) or int32 [N, G * 8] bytes (Q8_0)
- qh: Q5_K int32 [N, G] (bit i = fifth bit of value i); Q6_K int16 [N, G * 4] (word l's
  top two bits, slot s at bits 2s..2s+1)
- sc: int16 [N, G]: Q4_0 / Q8_0 the block's fp16 d bits; Q4_K / Q5_K the 6-bit scale and
  min of the sub-block (scale | min << 8); Q6_K the two int8 scales of its 16-value halves
- d: Q4_K / Q5_K int32 [N, K / 256] (fp16 d | fp16 dmin << 16); Q6_K int16 [N, K / 256]

Bytes per weight equal the raw ones but for Q4_K / Q5_K (+2 bytes per 256 values: the
unpacked 6-bit scales), recorded in docs/kernels.md. Integer dtypes only, so a module's
.to(dtype) never casts them. Mirrors the load-time repack of vLLM's Marlin / ExLlama
kernels (vllm/model_executor/layers/quantization/utils/marlin_utils.py), own layout.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from engine.errors import UnsupportedError
from engine.gguf.constants import GGML_TYPE_TRAITS, GGMLType
from kernels._common import check

# type id -> int32 words of the qs plane per 32-value group
PACKED_TYPES: dict[int, int] = {
    GGMLType.Q4_0: 4, GGMLType.Q8_0: 8, GGMLType.Q4_K: 4, GGMLType.Q5_K: 4, GGMLType.Q6_K: 4,
}


class PackedGGUF(NamedTuple):
    """One repacked weight [N, K] of GGML type `qtype` (planes as the module docstring)."""

    qtype: int
    qs: torch.Tensor
    qh: torch.Tensor | None
    sc: torch.Tensor
    d: torch.Tensor | None

    @property
    def shape(self) -> tuple[int, int]:
        """(N, K), from the qs plane's own shape."""
        wpg = PACKED_TYPES[self.qtype]
        return self.qs.shape[0], self.qs.shape[1] // wpg * 32

    def planes(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in zip(("qs", "qh", "sc", "d"), self[1:]) if v is not None}


def _as_int32(b: torch.Tensor) -> torch.Tensor:
    """[..., 4m] uint8 (little-endian words) -> [..., m] int32 (a contiguous copy)."""
    return b.contiguous().view(torch.int32)


def _pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """q [N, G, 32] uint8 (0..15, value i) -> [N, G * 4] int32: word l, slot s = value 4s+l."""
    n, g = q.shape[:2]
    q = q.view(n, g, 4, 2, 4)  # (byte b, nibble h, word l): slot s = 2b + h
    byte = q[:, :, :, 0] | (q[:, :, :, 1] << 4)  # [N, G, 4 (b), 4 (l)]
    return _as_int32(byte.transpose(2, 3)).view(n, g * 4)


def _pack_bytes(u: torch.Tensor) -> torch.Tensor:
    """u [N, G, 32] uint8 -> [N, G * 8] int32: word l, byte s = value 8s + l."""
    n, g = u.shape[:2]
    return _as_int32(u.view(n, g, 4, 8).transpose(2, 3)).view(n, g * 8)


def _pack_bits(bits: torch.Tensor, width: int) -> torch.Tensor:
    """[..., 8 / width * m] uint8 fields of `width` bits -> [..., m] uint8 (field t of a
    byte at bits width * t)."""
    shifts = torch.arange(0, 8, width, dtype=torch.uint8, device=bits.device)
    f = bits.reshape(*bits.shape[:-1], -1, 8 // width) << shifts
    return f.sum(-1, dtype=torch.uint8)  # fields do not overlap: the sum is their OR


def _k_scale_min(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[n, 12] uint8 of 8 packed 6-bit (scale, min) pairs -> two [n, 8] uint8
    (llama.cpp get_scale_min_k4)."""
    lo, mn_lo, hi = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    sc = torch.cat([lo & 0x3F, (hi & 0x0F) | ((lo >> 2) & 0x30)], dim=-1)
    mn = torch.cat([mn_lo & 0x3F, (hi >> 4) | ((mn_lo >> 2) & 0x30)], dim=-1)
    return sc, mn


def _kquant_low(qs: torch.Tensor) -> torch.Tensor:
    """[b, 128] uint8 of a Q4_K / Q5_K block -> [b, 8, 32] values' low nibbles in order."""
    q = qs.reshape(-1, 4, 1, 32) >> torch.tensor([0, 4], dtype=torch.uint8,
                                                  device=qs.device).view(1, 1, 2, 1)
    return (q & 0x0F).reshape(-1, 8, 32)


def _repack_blocks(blocks: torch.Tensor, qtype: int, n: int) -> PackedGGUF:
    """blocks [N * blocks_per_row, type_size] uint8 -> PackedGGUF."""
    if qtype in (GGMLType.Q4_0, GGMLType.Q8_0):
        d = blocks[:, 0:2].contiguous().view(torch.int16).view(n, -1)  # [N, G]
        if qtype == GGMLType.Q8_0:
            return PackedGGUF(qtype, _pack_bytes((blocks[:, 2:34] ^ 0x80).view(n, -1, 32)),
                              None, d, None)
        q = torch.cat([blocks[:, 2:18] & 0x0F, blocks[:, 2:18] >> 4], dim=1)  # [b, 32]
        return PackedGGUF(qtype, _pack_nibbles(q.view(n, -1, 32)), None, d, None)
    if qtype == GGMLType.Q6_K:
        low = (blocks[:, :128].reshape(-1, 2, 1, 64) >> torch.tensor(
            [0, 4], dtype=torch.uint8, device=blocks.device).view(1, 1, 2, 1)) & 0x0F
        high = (blocks[:, 128:192].reshape(-1, 2, 1, 32) >> torch.tensor(
            [0, 2, 4, 6], dtype=torch.uint8, device=blocks.device).view(1, 1, 4, 1)) & 3
        low, high = low.reshape(n, -1, 32), high.reshape(n, -1, 32)  # [N, G, 32]
        g = low.shape[1]
        # [N, G, b, t, l] (slot s = 4b + t) -> per word l two bytes of 2-bit fields
        hi = _pack_bits(high.view(n, g, 2, 4, 4).permute(0, 1, 4, 2, 3), 2)
        qh = hi.reshape(n, g * 8).view(torch.int16)  # [N, G * 4]: word l, slot s at 2s
        sc = blocks[:, 192:208].contiguous().view(torch.int16).view(n, -1)  # [N, G]
        d = blocks[:, 208:210].contiguous().view(torch.int16).view(n, -1)  # [N, K / 256]
        return PackedGGUF(qtype, _pack_nibbles(low), qh, sc, d)
    # Q4_K / Q5_K: d | dmin | scales[12] | (Q5_K: qh[32]) | qs[128]
    qs_at = 48 if qtype == GGMLType.Q5_K else 16
    q = _kquant_low(blocks[:, qs_at:qs_at + 128]).view(n, -1, 32)  # [N, G, 32]
    sc, mn = _k_scale_min(blocks[:, 4:16])  # [b, 8]
    sm = torch.stack([sc, mn], dim=-1).contiguous().view(torch.int16).view(n, -1)
    d = blocks[:, 0:4].contiguous().view(torch.int32).view(n, -1)  # [N, K / 256]
    qh = None
    if qtype == GGMLType.Q5_K:  # bit j of qh[i] = fifth bit of value i of sub-block j
        bits = (blocks[:, 16:48].unsqueeze(1) >> torch.arange(
            8, dtype=torch.uint8, device=blocks.device).view(1, 8, 1)) & 1  # [b, 8, 32]
        qh = _as_int32(_pack_bits(bits.reshape(n, -1, 32), 1)).view(n, -1)  # [N, G]
    return PackedGGUF(qtype, _pack_nibbles(q), qh, sm, d)


def repack(raw: torch.Tensor, qtype: int, chunk_rows: int = 4096) -> PackedGGUF:
    """Raw GGUF rows [N, row_bytes] uint8 -> PackedGGUF on raw's device (in row chunks to
    bound the temporaries). K comes from the row's own byte count."""
    if qtype not in PACKED_TYPES:
        raise UnsupportedError(f"no packed GGUF layout for type {qtype}")
    block, type_size = GGML_TYPE_TRAITS[GGMLType(qtype)]
    check(raw.dtype == torch.uint8 and raw.dim() == 2 and raw.shape[1] % type_size == 0,
          lambda: f"{GGMLType(qtype).name}: raw rows must be [N, whole {type_size}-byte "
          f"blocks] uint8, got {tuple(raw.shape)} {raw.dtype}")
    check(raw.shape[1] > 0, "raw rows must hold at least one block")
    parts = []
    for r0 in range(0, max(raw.shape[0], 1), chunk_rows):
        rows = raw[r0:r0 + chunk_rows].contiguous()
        parts.append(_repack_blocks(rows.view(-1, type_size), qtype, rows.shape[0]))
    if len(parts) == 1:
        return parts[0]
    return PackedGGUF(qtype, *(None if parts[0][i] is None else
                               torch.cat([p[i] for p in parts]) for i in range(1, 5)))
