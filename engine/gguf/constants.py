"""GGUF/GGML constants: file-format limits, metadata value types, GGML tensor type table.

Mirrors llama.cpp ggml/include/ggml.h (GGML_MAX_DIMS, GGML_MAX_NAME) and
ggml/include/gguf.h (enum gguf_type, GGUF_MAGIC, GGUF_DEFAULT_ALIGNMENT). The tensor type
ids and their block sizes (GGMLType, GGML_TYPE_TRAITS, QK_K) are pure data the GGUF kernels
need too, so they live in kernels/ggml_types.py (the bottom layer) and are re-exported here.
"""

from enum import IntEnum

from libvllm.kernels.ggml_types import GGML_TYPE_TRAITS, QK_K, GGMLType, TypeTraits

__all__ = ["GGML_MAX_DIMS", "GGML_MAX_NAME", "GGML_TYPE_TRAITS", "GGUF_ALIGNMENT_KEY",
           "GGUF_DEFAULT_ALIGNMENT", "GGUF_MAGIC", "QK_K", "REMOVED_GGML_TYPES",
           "SCALAR_FORMATS", "GGMLType", "GGUFValueType", "TypeTraits"]

GGUF_MAGIC = b"GGUF"
GGUF_DEFAULT_ALIGNMENT = 32
GGUF_ALIGNMENT_KEY = "general.alignment"
GGML_MAX_DIMS = 4
GGML_MAX_NAME = 64  # includes the C string terminator: names are at most 63 bytes


class GGUFValueType(IntEnum):
    """Metadata value type ids (enum gguf_type)."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# Fixed-size value types -> little-endian struct format (numpy accepts the same strings).
SCALAR_FORMATS: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<B",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}


# Ids ggml once used and has since dropped; files carrying them cannot be loaded.
REMOVED_GGML_TYPES: dict[int, str] = {
    4: "Q4_2",
    5: "Q4_3",
    31: "Q4_0_4_4",
    32: "Q4_0_4_8",
    33: "Q4_0_8_8",
    36: "IQ4_NL_4_4",
    37: "IQ4_NL_4_8",
    38: "IQ4_NL_8_8",
}
