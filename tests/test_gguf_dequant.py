"""engine.gguf.dequant: torch dequantization of every implemented GGML type is bit-exact.

Oracle: gguf.quants.dequantize (the gguf package's numpy port of ggml-quants.c) on the same
bytes; for Q8_K, which that package lacks, the ggml formula y = d * q written out in numpy.
The IQ*, TQ* and MXFP4 types are dequantized by gguf.quants itself: blocks built by hand
from llama.cpp's ggml-common.h tables (kvalues_iq4nl, kvalues_mxfp4, iq2xxs_grid[0], the
ternary digits) check their values independently of it.
Inputs: values quantized by gguf.quants.quantize where the package can quantize the type, and
random block bytes (all bit patterns) with finite fp16 scale fields for every type. The type
table is checked against gguf.GGML_QUANT_SIZES.
"""

import gguf
import numpy as np
import pytest
import torch

from libvllm.engine.errors import InvalidArgumentError, UnsupportedError
from libvllm.engine.gguf import dequant
from libvllm.engine.gguf.constants import GGML_TYPE_TRAITS, GGMLType
from libvllm.engine.gguf.dequant import GGUF_PY_TYPES, SUPPORTED_TYPES, dequantize, dequantize_rows

# Byte offsets of the fp16 scale fields inside one block, per quantized type.
FP16_FIELDS = {
    GGMLType.Q4_0: (0,),
    GGMLType.Q4_1: (0, 2),
    GGMLType.Q5_0: (0,),
    GGMLType.Q5_1: (0, 2),
    GGMLType.Q8_0: (0,),
    GGMLType.Q2_K: (80, 82),
    GGMLType.Q3_K: (108,),
    GGMLType.Q4_K: (0, 2),
    GGMLType.Q5_K: (0, 2),
    GGMLType.Q6_K: (208,),
    GGMLType.IQ2_XXS: (0,),
    GGMLType.IQ2_XS: (0,),
    GGMLType.IQ2_S: (0,),
    GGMLType.IQ3_XXS: (0,),
    GGMLType.IQ3_S: (0,),
    GGMLType.IQ1_S: (0,),
    GGMLType.IQ4_NL: (0,),
    GGMLType.IQ4_XS: (0,),
    GGMLType.TQ1_0: (52,),
    GGMLType.TQ2_0: (64,),
}
# GGUF_PY_TYPES are dequantized by gguf.quants itself: the random-bytes comparison checks
# their wiring only; the hand-built blocks below check their values from ggml-common.h.
KVALUES_IQ4NL = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
KVALUES_MXFP4 = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)  # e2m1, doubled
FLOAT_TYPES = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)
QUANTIZABLE = (
    GGMLType.F16,
    GGMLType.BF16,
    GGMLType.Q4_0,
    GGMLType.Q4_1,
    GGMLType.Q5_0,
    GGMLType.Q5_1,
    GGMLType.Q8_0,
)
BLOCK_COUNTS = (1, 3, 70)


def random_blocks(ggml_type: GGMLType, n_blocks: int, seed: int) -> np.ndarray:
    """[n_blocks * type_size] uint8: random bytes, scale fields overwritten by finite values."""
    rng = np.random.default_rng(seed)
    type_size = GGML_TYPE_TRAITS[ggml_type].type_size
    blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    for at in FP16_FIELDS.get(ggml_type, ()):
        scale = (rng.standard_normal(n_blocks) * 0.05).astype(np.float16)
        blocks[:, at : at + 2] = scale.view(np.uint8).reshape(n_blocks, 2)
    if ggml_type == GGMLType.Q8_K:
        blocks[:, 0:4] = (
            rng.standard_normal(n_blocks).astype(np.float32).view(np.uint8).reshape(-1, 4)
        )
    return blocks.reshape(-1)


def reference(raw: np.ndarray, ggml_type: GGMLType) -> np.ndarray:
    """The oracle's float32 values for raw blocks."""
    if ggml_type == GGMLType.Q8_K:
        blocks = raw.reshape(-1, GGML_TYPE_TRAITS[ggml_type].type_size)
        d = blocks[:, 0:4].copy().view(np.float32)  # [n, 1]
        q = blocks[:, 4:260].copy().view(np.int8).astype(np.float32)  # [n, 256]
        return (d * q).reshape(-1)
    with np.errstate(all="ignore"):  # random IQ1_M scales may overflow, as in ggml
        return gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(int(ggml_type))
                                      ).reshape(-1)


def ours(raw: np.ndarray, ggml_type: GGMLType, n_elements: int) -> np.ndarray:
    return dequantize(torch.from_numpy(raw.copy()), ggml_type, n_elements).numpy()


def assert_bit_exact(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype == np.float32 and got.shape == want.shape
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan])


def test_type_table_matches_gguf_package():
    for ggml_type, traits in GGML_TYPE_TRAITS.items():
        assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(int(ggml_type))] == traits
        assert gguf.GGMLQuantizationType(int(ggml_type)).name == ggml_type.name


@pytest.mark.parametrize("n_blocks", BLOCK_COUNTS)
@pytest.mark.parametrize("ggml_type", sorted(SUPPORTED_TYPES), ids=lambda t: t.name)
def test_random_bytes_bit_exact(ggml_type, n_blocks):
    raw = random_blocks(ggml_type, n_blocks, seed=n_blocks * 100 + ggml_type)
    n_elements = n_blocks * GGML_TYPE_TRAITS[ggml_type].block_size
    assert_bit_exact(ours(raw, ggml_type, n_elements), reference(raw, ggml_type))


@pytest.mark.parametrize("n_blocks", BLOCK_COUNTS)
@pytest.mark.parametrize("ggml_type", QUANTIZABLE, ids=lambda t: t.name)
def test_quantized_values_bit_exact(ggml_type, n_blocks):
    rng = np.random.default_rng(n_blocks)
    values = (rng.standard_normal((n_blocks, 32)) * 3).astype(np.float32)  # [n_blocks, 32]
    values[-1, :] = 0.0  # an all-zero block: scale 0
    raw = gguf.quants.quantize(values, gguf.GGMLQuantizationType(int(ggml_type)))
    raw = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    assert_bit_exact(ours(raw, ggml_type, values.size), reference(raw, ggml_type))


def test_f32_copies_exactly():
    values = np.random.default_rng(0).standard_normal(40).astype(np.float32)
    assert_bit_exact(ours(values.view(np.uint8), GGMLType.F32, 40), values)


def test_output_dtype_matches_float32_then_cast():
    raw = random_blocks(GGMLType.Q4_K, 2, seed=7)
    want = torch.from_numpy(reference(raw, GGMLType.Q4_K)).to(torch.bfloat16)
    got = dequantize(torch.from_numpy(raw), GGMLType.Q4_K, 512, dtype=torch.bfloat16)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)


def test_chunked_output_matches(monkeypatch):
    monkeypatch.setattr(dequant, "_CHUNK_ELEMENTS", 3 * 32)  # 3 blocks of 32 per chunk
    raw = random_blocks(GGMLType.Q5_1, 10, seed=3)
    assert_bit_exact(ours(raw, GGMLType.Q5_1, 320), reference(raw, GGMLType.Q5_1))


def test_rows_dequantize_each_row_alone():
    """[2, 3, row_bytes] rows of Q4_K (2 super-blocks a row) -> [2, 3, 512], row by row."""
    _, type_size = GGML_TYPE_TRAITS[GGMLType.Q4_K]
    g = torch.Generator().manual_seed(0)
    raw = torch.randint(0, 256, (2, 3, 2 * type_size), dtype=torch.uint8, generator=g)
    out = dequantize_rows(raw, GGMLType.Q4_K, torch.float16)
    assert out.shape == (2, 3, 512) and out.dtype == torch.float16
    for i in range(2):
        for j in range(3):  # random scale bytes may be inf/NaN: equal NaN positions too
            want = dequantize(raw[i, j].clone(), GGMLType.Q4_K, 512).to(torch.float16)
            torch.testing.assert_close(out[i, j], want, rtol=0, atol=0, equal_nan=True)


def test_result_does_not_alias_input():
    raw = torch.from_numpy(np.arange(4, dtype=np.float32).view(np.uint8))
    out = dequantize(raw, GGMLType.F32, 4)
    out += 1
    assert raw.view(torch.float32).tolist() == [0.0, 1.0, 2.0, 3.0]


def _block(*fields: bytes) -> np.ndarray:
    return np.frombuffer(b"".join(fields), dtype=np.uint8).copy()


def _f16(x: float) -> bytes:
    return np.float16(x).tobytes()


def test_iq4_nl_block_by_hand():
    """dequantize_row_iq4_nl: y[j] = d kvalues[qs[j] & 15], y[j + 16] = d kvalues[qs[j] >> 4]."""
    qs = bytes(j | (15 - j) << 4 for j in range(16))
    got = ours(_block(_f16(0.5), qs), GGMLType.IQ4_NL, 32)
    want = [0.5 * KVALUES_IQ4NL[j] for j in range(16)] + \
        [0.5 * KVALUES_IQ4NL[15 - j] for j in range(16)]
    assert got.tolist() == want


def test_mxfp4_block_by_hand():
    """dequantize_row_mxfp4: d = GGML_E8M0_TO_FP32_HALF(e) = 2^(e - 128) for e >= 2."""
    qs = bytes(j | (15 - j) << 4 for j in range(16))
    got = ours(_block(bytes([130]), qs), GGMLType.MXFP4, 32)
    assert got.tolist() == [4.0 * KVALUES_MXFP4[j] for j in range(16)] + \
        [4.0 * KVALUES_MXFP4[15 - j] for j in range(16)]


def test_iq4_xs_block_by_hand():
    """dequantize_row_iq4_xs: sub-block ib's scale ls = 4 low bits of scales_l[ib / 2]
    (nibble ib % 2) | 2 bits of scales_h << 4, dl = d * (ls - 32)."""
    scales_h = np.uint16(0b01 << 2 * 7).tobytes()  # sub-block 7: +16
    raw = _block(_f16(1.0), scales_h, bytes([0x21] * 4), bytes([0x98] * 128))
    got = ours(raw, GGMLType.IQ4_XS, 256).reshape(8, 32)
    for ib in range(8):
        dl = (1 if ib % 2 == 0 else 2) + (16 if ib == 7 else 0) - 32
        assert got[ib].tolist() == [dl * KVALUES_IQ4NL[8]] * 16 + [dl * KVALUES_IQ4NL[9]] * 16


def test_ternary_blocks_by_hand():
    """TQ2_0: 2-bit digits q, y = (q - 1) d, bit pair l of byte j*32 + m -> y[j*128 + l*32 + m];
    TQ1_0: all-zero base-3 digits are -1 (y = -d)."""
    got = ours(_block(bytes([0b11100100] * 64), _f16(0.5)), GGMLType.TQ2_0, 256)
    assert got.tolist() == ([-0.5] * 32 + [0.0] * 32 + [0.5] * 32 + [1.0] * 32) * 2
    got = ours(_block(bytes(48 + 4), _f16(2.0)), GGMLType.TQ1_0, 256)
    assert got.tolist() == [-2.0] * 256


def test_iq2_xxs_zero_block_by_hand():
    """iq2xxs_grid[0] is eight 8s, ksigns_iq2xs[0] no sign, scale nibble 0:
    y = d * (0.5 + 0) * 0.25 * 8 = d for all 256 values."""
    assert ours(_block(_f16(3.0), bytes(64)), GGMLType.IQ2_XXS, 256).tolist() == [3.0] * 256


@pytest.mark.parametrize("ggml_type", GGUF_PY_TYPES, ids=lambda t: t.name)
def test_gguf_py_types_keep_device_dtype_and_chunks(ggml_type, monkeypatch):
    block_size = GGML_TYPE_TRAITS[ggml_type].block_size
    monkeypatch.setattr(dequant, "_CHUNK_ELEMENTS", 2 * block_size)  # 2 blocks a chunk
    raw = random_blocks(ggml_type, 5, seed=ggml_type)
    want = torch.from_numpy(reference(raw, ggml_type)).to(torch.bfloat16)
    got = dequantize(torch.from_numpy(raw), ggml_type, 5 * block_size, torch.bfloat16)
    assert got.dtype == torch.bfloat16 and got.device == torch.device("cpu")
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("ggml_type", [GGMLType.NVFP4, GGMLType.Q1_0, GGMLType.Q8_1,
                                       GGMLType.I32, 999])
def test_unsupported_type(ggml_type):
    with pytest.raises(UnsupportedError, match="not supported"):
        dequantize(torch.zeros(1024, dtype=torch.uint8), ggml_type, 256)


@pytest.mark.parametrize(
    "raw, n_elements",
    [
        (torch.zeros(34, dtype=torch.uint8), 64),  # too few bytes
        (torch.zeros(35, dtype=torch.uint8), 32),  # too many bytes
        (torch.zeros(34, dtype=torch.uint8), 31),  # not whole blocks
        (torch.zeros(34, dtype=torch.int8), 32),  # not bytes
    ],
)
def test_size_mismatch(raw, n_elements):
    with pytest.raises(InvalidArgumentError):
        dequantize(raw, GGMLType.Q8_0, n_elements)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("ggml_type", sorted(SUPPORTED_TYPES), ids=lambda t: t.name)
def test_cuda_bit_exact(ggml_type):
    raw = random_blocks(ggml_type, 300, seed=ggml_type)
    n_elements = 300 * GGML_TYPE_TRAITS[ggml_type].block_size
    got = dequantize(torch.from_numpy(raw).cuda(), ggml_type, n_elements)
    assert got.is_cuda
    assert_bit_exact(got.cpu().numpy(), reference(raw, ggml_type))
