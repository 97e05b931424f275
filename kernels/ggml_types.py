"""GGML tensor type ids and their block sizes: the data engine/gguf/ and the GGUF kernels share.

Mirrors llama.cpp ggml/include/ggml.h (enum ggml_type) and ggml/src/ggml.c (type_traits:
elements and bytes per block). Pure data at the bottom layer: kernels/gguf_gemm.py and
kernels/moe_gguf.py size their blocks from it, engine/gguf/constants.py re-exports it for
the reader and the torch dequantizer. Imports nothing beyond the standard library.
"""

from enum import IntEnum
from typing import NamedTuple

QK_K = 256  # elements per K-quant super-block


class GGMLType(IntEnum):
    """Tensor element type ids (enum ggml_type)."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39
    NVFP4 = 40
    Q1_0 = 41


class TypeTraits(NamedTuple):
    block_size: int  # elements per block
    type_size: int  # bytes per block


GGML_TYPE_TRAITS: dict[GGMLType, TypeTraits] = {
    GGMLType.F32: TypeTraits(1, 4),
    GGMLType.F16: TypeTraits(1, 2),
    GGMLType.Q4_0: TypeTraits(32, 2 + 16),
    GGMLType.Q4_1: TypeTraits(32, 2 + 2 + 16),
    GGMLType.Q5_0: TypeTraits(32, 2 + 4 + 16),
    GGMLType.Q5_1: TypeTraits(32, 2 + 2 + 4 + 16),
    GGMLType.Q8_0: TypeTraits(32, 2 + 32),
    GGMLType.Q8_1: TypeTraits(32, 4 + 4 + 32),
    GGMLType.Q2_K: TypeTraits(QK_K, QK_K // 16 + QK_K // 4 + 2 + 2),
    GGMLType.Q3_K: TypeTraits(QK_K, QK_K // 8 + QK_K // 4 + 12 + 2),
    GGMLType.Q4_K: TypeTraits(QK_K, 2 + 2 + 12 + QK_K // 2),
    GGMLType.Q5_K: TypeTraits(QK_K, 2 + 2 + 12 + QK_K // 8 + QK_K // 2),
    GGMLType.Q6_K: TypeTraits(QK_K, QK_K // 2 + QK_K // 4 + QK_K // 16 + 2),
    GGMLType.Q8_K: TypeTraits(QK_K, 4 + QK_K + QK_K // 8),
    GGMLType.IQ2_XXS: TypeTraits(QK_K, 2 + QK_K // 4),
    GGMLType.IQ2_XS: TypeTraits(QK_K, 2 + QK_K // 4 + QK_K // 32),
    GGMLType.IQ3_XXS: TypeTraits(QK_K, 2 + QK_K // 4 + QK_K // 8),
    GGMLType.IQ1_S: TypeTraits(QK_K, 2 + QK_K // 8 + QK_K // 16),
    GGMLType.IQ4_NL: TypeTraits(32, 2 + 16),
    GGMLType.IQ3_S: TypeTraits(QK_K, 2 + QK_K // 4 + QK_K // 8 + QK_K // 32 + 4),
    GGMLType.IQ2_S: TypeTraits(QK_K, 2 + QK_K // 4 + QK_K // 16),
    GGMLType.IQ4_XS: TypeTraits(QK_K, 2 + 2 + QK_K // 2 + QK_K // 64),
    GGMLType.I8: TypeTraits(1, 1),
    GGMLType.I16: TypeTraits(1, 2),
    GGMLType.I32: TypeTraits(1, 4),
    GGMLType.I64: TypeTraits(1, 8),
    GGMLType.F64: TypeTraits(1, 8),
    GGMLType.IQ1_M: TypeTraits(QK_K, QK_K // 8 + QK_K // 16 + QK_K // 32),
    GGMLType.BF16: TypeTraits(1, 2),
    GGMLType.TQ1_0: TypeTraits(QK_K, 2 + 4 * 13),
    GGMLType.TQ2_0: TypeTraits(QK_K, 2 + 64),
    GGMLType.MXFP4: TypeTraits(32, 1 + 16),
    GGMLType.NVFP4: TypeTraits(64, 4 + 32),
    GGMLType.Q1_0: TypeTraits(128, 2 + 16),
}
