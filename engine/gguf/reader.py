"""Hardened GGUF reader: header, metadata, tensor table and tensor data of a .gguf file.

Mirrors llama.cpp ggml/src/gguf.cpp (gguf_init_from_file_impl) and its validation rules,
tightened because the file is treated as hostile: every count, length, shape, offset and
alignment is checked against hard caps and against the bytes actually left in the file
before anything is allocated or sliced. As in llama.cpp, general.alignment is a UINT32 power
of two and tensor data is packed: each tensor starts where the previous one's aligned data
ends, in table order, so no two tensors overlap and no byte is unaccounted for. Caps bound
the Python objects a header can ask for (tensors, keys, array elements in all), whatever the
file size. The file is memory-mapped, never read whole; tensor data is handed out as
zero-copy views of the mapping. Any malformed input raises
ModelLoadError("<path>: <what> at offset N"). Reading metadata imports no torch (a front end
loads its tokenizer from here: .agents/specs/torch-free-front-end.md); load_tensor does.
"""

from __future__ import annotations

import math
import mmap
import os
import stat
import struct
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from libvllm.engine.errors import ModelLoadError, UnsupportedError
from libvllm.engine.gguf.constants import (
    GGML_MAX_DIMS,
    GGML_MAX_NAME,
    GGML_TYPE_TRAITS,
    GGUF_ALIGNMENT_KEY,
    GGUF_DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    REMOVED_GGML_TYPES,
    SCALAR_FORMATS,
    GGMLType,
    GGUFValueType,
)

if TYPE_CHECKING:
    import torch

SUPPORTED_VERSIONS = (2, 3)
MAX_STRING_BYTES = 1 << 26
MAX_ARRAY_DEPTH = 2  # an array may hold arrays, which may not hold arrays
MAX_ELEMENTS = 1 << 62  # per tensor
MAX_TENSORS = 1 << 16  # real models: a few thousand at most
MAX_KV = 1 << 16  # real models: under a hundred keys
# Array elements in all of the metadata (Gemma 3: 262144 tokens x 3 arrays); each becomes a
# Python object, so this bounds memory and time whatever the file size.
MAX_METADATA_ELEMENTS = 1 << 22

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_SCALARS = {t: struct.Struct(f) for t, f in SCALAR_FORMATS.items()}
_VALUE_TYPES = frozenset(t.value for t in GGUFValueType)
_GGML_TYPES = frozenset(t.value for t in GGMLType)
# Fewest bytes one array element can occupy: a string is at least its u64 length, an array
# at least its u32 type + u64 count.
_MIN_ELEMENT_BYTES = {t: s.size for t, s in _SCALARS.items()} | {
    GGUFValueType.STRING: 8,
    GGUFValueType.ARRAY: 4 + 8,
}
_MIN_KV_BYTES = 8 + 4 + 1  # key length, value type, smallest value
_MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 4 + 8  # name length, 1-byte name, n_dims, type, offset


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    shape: tuple[int, ...]  # torch/numpy row-major order: ggml's ne reversed
    ggml_type: int
    type_name: str
    offset: int  # absolute byte offset of the data in the file
    nbytes: int

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)


class _Parser:
    """Bounds-checked little-endian cursor over the mapped file."""

    def __init__(self, path: str, buf: mmap.mmap) -> None:
        self.path = path
        self.buf = buf
        self.size = len(buf)
        self.pos = 0
        self.elements_left = MAX_METADATA_ELEMENTS

    def error(self, what: str, at: int | None = None) -> ModelLoadError:
        return ModelLoadError(f"{self.path}: {what} at offset {self.pos if at is None else at}")

    @property
    def left(self) -> int:
        return self.size - self.pos

    def take(self, n: int, what: str) -> int:
        """Consume n bytes; return where they start."""
        if n > self.left:
            raise self.error(f"file truncated: {what} needs {n} bytes, {self.left} left")
        start = self.pos
        self.pos += n
        return start

    def scalar(self, fmt: struct.Struct, what: str) -> int | float:
        return fmt.unpack_from(self.buf, self.take(fmt.size, what))[0]

    def u32(self, what: str) -> int:
        return self.scalar(_U32, what)

    def u64(self, what: str) -> int:
        return self.scalar(_U64, what)

    def string(self, what: str, max_bytes: int = MAX_STRING_BYTES) -> str:
        at = self.pos
        n = self.u64(f"{what} length")
        if n > max_bytes:
            raise self.error(f"{what} length {n} exceeds the limit of {max_bytes} bytes", at)
        start = self.take(n, what)
        try:
            return str(self.buf[start : start + n], "utf-8")
        except UnicodeDecodeError:
            raise self.error(f"{what} is not valid UTF-8", start) from None

    def value_type(self, what: str) -> GGUFValueType:
        at = self.pos
        t = self.u32(f"{what} type")
        if t not in _VALUE_TYPES:
            raise self.error(f"{what} has unknown value type {t}", at)
        return GGUFValueType(t)

    def value(self, vtype: GGUFValueType, what: str, depth: int = 0) -> object:
        if vtype == GGUFValueType.STRING:
            return self.string(what)
        if vtype == GGUFValueType.ARRAY:
            return self.array(what, depth + 1)
        at = self.pos
        v = self.scalar(_SCALARS[vtype], what)
        if vtype != GGUFValueType.BOOL:
            return v
        if v > 1:
            raise self.error(f"{what}: bool value {v} is neither 0 nor 1", at)
        return bool(v)

    def array(self, what: str, depth: int) -> list:
        at = self.pos
        if depth > MAX_ARRAY_DEPTH:
            raise self.error(f"{what}: arrays nested deeper than {MAX_ARRAY_DEPTH} levels", at)
        etype = self.value_type(f"{what} element")
        count = self.u64(f"{what} element count")
        if count > self.elements_left:
            raise self.error(
                f"{what}: array of {count} elements exceeds the metadata limit of "
                f"{MAX_METADATA_ELEMENTS} array elements in all",
                at,
            )
        self.elements_left -= count
        if count > self.left // _MIN_ELEMENT_BYTES[etype]:
            raise self.error(
                f"{what}: array of {count} {etype.name} elements cannot fit in the "
                f"{self.left} bytes left",
                at,
            )
        if etype == GGUFValueType.STRING:
            return self.string_array(count, what)
        if etype == GGUFValueType.ARRAY:
            return [self.array(what, depth + 1) for _ in range(count)]
        return self.numeric_array(etype, count, what)

    def string_array(self, count: int, what: str) -> list[str]:
        """count strings as string() reads them, in one loop (a vocabulary holds 49k-262k);
        a string that string() would refuse is read by it, for its error."""
        buf, pos, size, out = self.buf, self.pos, self.size, []
        for _ in range(count):
            n = _U64.unpack_from(buf, pos)[0] if size - pos >= 8 else -1
            start = pos + 8
            try:
                if not 0 <= n <= min(MAX_STRING_BYTES, size - start):
                    raise ValueError
                out.append(str(buf[start : start + n], "utf-8"))
            except ValueError:  # UnicodeDecodeError is one
                self.pos = pos
                self.string(what)  # raises this string's ModelLoadError
                raise
            pos = start + n
        self.pos = pos
        return out

    def numeric_array(self, etype: GGUFValueType, count: int, what: str) -> list:
        if count == 0:
            return []
        dtype = np.dtype(SCALAR_FORMATS[etype])
        start = self.take(count * dtype.itemsize, what)
        values = np.frombuffer(self.buf, dtype=dtype, count=count, offset=start)
        if etype != GGUFValueType.BOOL:
            return values.tolist()
        if values.max() > 1:
            raise self.error(f"{what}: bool array holds a value other than 0 or 1", start)
        return values.astype(bool).tolist()

    def header(self) -> tuple[int, int, int]:
        """magic, version, tensor count, kv count -> (version, n_tensors, n_kv)."""
        start = self.take(4, "magic")
        magic = self.buf[start : start + 4]
        if magic != GGUF_MAGIC:
            raise self.error(f"bad magic {magic!r} (expected {GGUF_MAGIC!r}), not a GGUF file", 0)
        version = self.u32("version")
        if version & 0xFFFF == 0 and version != 0:
            raise self.error("big-endian GGUF files are not supported", 4)
        if version not in SUPPORTED_VERSIONS:
            hint = " (GGUFv1 is obsolete: re-convert the model)" if version == 1 else ""
            raise self.error(f"unsupported GGUF version {version}{hint}", 4)
        n_tensors = self.u64("tensor count")
        if n_tensors > MAX_TENSORS:
            raise self.error(f"tensor count {n_tensors} exceeds the limit of {MAX_TENSORS}", 8)
        if n_tensors > self.left // _MIN_TENSOR_INFO_BYTES:
            raise self.error(f"tensor count {n_tensors} cannot fit in the file", 8)
        n_kv = self.u64("metadata count")
        if n_kv > MAX_KV:
            raise self.error(f"metadata count {n_kv} exceeds the limit of {MAX_KV}", 16)
        if n_kv > self.left // _MIN_KV_BYTES:
            raise self.error(f"metadata count {n_kv} cannot fit in the file", 16)
        return version, n_tensors, n_kv

    def metadata(self, n_kv: int) -> tuple[dict[str, object], int]:
        """Key/value pairs -> (metadata, alignment)."""
        metadata: dict[str, object] = {}
        alignment = GGUF_DEFAULT_ALIGNMENT
        for _ in range(n_kv):
            at = self.pos
            key = self.string("metadata key")
            if key in metadata:
                raise self.error(f"duplicate metadata key {key!r}", at)
            vtype = self.value_type(repr(key))
            metadata[key] = value = self.value(vtype, repr(key))
            if key == GGUF_ALIGNMENT_KEY:
                if vtype != GGUFValueType.UINT32 or value <= 0 or value & (value - 1):
                    raise self.error(
                        f"{key} must be a UINT32 nonzero power of two, got {vtype.name} {value!r}",
                        at,
                    )
                alignment = value
        return metadata, alignment

    def tensor_info(self, alignment: int) -> tuple[str, tuple[int, ...], GGMLType, int, int]:
        """One tensor-table entry -> (name, shape, type, data offset, nbytes), validated."""
        at = self.pos
        name = self.string("tensor name", GGML_MAX_NAME - 1)
        if not name:
            raise self.error("empty tensor name", at)
        n_dims = self.u32(f"tensor {name!r} n_dims")
        if n_dims > GGML_MAX_DIMS:
            raise self.error(f"tensor {name!r} has {n_dims} dims (max {GGML_MAX_DIMS})", at)
        ne = [self.u64(f"tensor {name!r} dimension") for _ in range(n_dims)]
        n_elements = 1
        for dim in ne:
            if dim == 0:
                raise self.error(f"tensor {name!r} has a zero dimension {ne}", at)
            n_elements *= dim
            if n_elements > MAX_ELEMENTS:
                raise self.error(f"tensor {name!r} dimensions {ne} overflow 2^62 elements", at)
        type_at = self.pos
        type_id = self.u32(f"tensor {name!r} type")
        if type_id in REMOVED_GGML_TYPES:
            what = f"GGML type {REMOVED_GGML_TYPES[type_id]} ({type_id}), removed from ggml"
            raise self.error(f"tensor {name!r} has {what}: re-quantize the model", type_at)
        if type_id not in _GGML_TYPES:
            raise self.error(f"tensor {name!r} has unknown GGML type {type_id}", type_at)
        ggml_type = GGMLType(type_id)
        block_size, type_size = GGML_TYPE_TRAITS[ggml_type]
        row = ne[0] if ne else 1
        if row % block_size:
            raise self.error(
                f"tensor {name!r} row of {row} elements is not a multiple of the "
                f"{ggml_type.name} block size {block_size}",
                at,
            )
        offset_at = self.pos
        offset = self.u64(f"tensor {name!r} offset")
        if offset % alignment:
            raise self.error(
                f"tensor {name!r} data offset {offset} is not a multiple of the alignment "
                f"{alignment}",
                offset_at,
            )
        return name, tuple(reversed(ne)), ggml_type, offset, n_elements // block_size * type_size

    def tensors(self, n_tensors: int, alignment: int) -> dict[str, GGUFTensorInfo]:
        entries = []
        names: set[str] = set()
        for _ in range(n_tensors):
            at = self.pos
            entry = self.tensor_info(alignment)
            if entry[0] in names:
                raise self.error(f"duplicate tensor name {entry[0]!r}", at)
            names.add(entry[0])
            entries.append(entry)
        data_start = -(-self.pos // alignment) * alignment
        tensors: dict[str, GGUFTensorInfo] = {}
        packed = 0  # where the next tensor must start, relative to data_start
        for name, shape, ggml_type, offset, nbytes in entries:
            if offset != packed:  # llama.cpp: "tensor has offset X, expected Y"
                raise self.error(
                    f"tensor {name!r} data offset {offset} is not {packed}: tensor data must be "
                    "packed in table order, each tensor aligned right after the previous one",
                    data_start + offset,
                )
            packed += -(-nbytes // alignment) * alignment
            start = data_start + offset
            if start + nbytes > self.size:
                raise self.error(
                    f"tensor {name!r} data [{start}, {start + nbytes}) extends past the end "
                    f"of the file ({self.size} bytes)",
                    start,
                )
            tensors[name] = GGUFTensorInfo(name, shape, ggml_type, ggml_type.name, start, nbytes)
        return tensors


def _map_file(path: str) -> mmap.mmap:
    """Open and memory-map a regular, non-empty file; OS errors become ModelLoadError."""
    try:
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            raise ModelLoadError(f"{path}: is a directory, not a GGUF file")
        if not stat.S_ISREG(st.st_mode):
            raise ModelLoadError(f"{path}: not a regular file")
        if st.st_size == 0:
            raise ModelLoadError(f"{path}: empty file, not a GGUF file at offset 0")
        with open(path, "rb") as f:
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except FileNotFoundError:
        raise ModelLoadError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ModelLoadError(f"{path}: is a directory, not a GGUF file") from None
    except OSError as e:
        raise ModelLoadError(f"{path}: cannot read: {e.strerror or e}") from None


class GGUFReader:
    """A parsed GGUF file. `metadata` and `tensors` are filled at construction."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        self._mm: mmap.mmap | None = _map_file(self.path)
        try:
            parser = _Parser(self.path, self._mm)
            self.version, n_tensors, n_kv = parser.header()
            self.metadata, self.alignment = parser.metadata(n_kv)
            self.tensors = parser.tensors(n_tensors, self.alignment)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> GGUFReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Unmap the file. Views from tensor_bytes keep the mapping alive until freed."""
        if self._mm is None:
            return
        try:
            self._mm.close()
        except BufferError:
            pass  # numpy views are still alive; the mapping goes with the last of them
        self._mm = None

    def _info(self, name: str) -> GGUFTensorInfo:
        if self._mm is None:
            raise ModelLoadError(f"{self.path}: reader is closed")
        info = self.tensors.get(name)
        if info is None:
            raise ModelLoadError(f"{self.path}: no tensor named {name!r}")
        return info

    def tensor_bytes(self, name: str) -> np.ndarray:
        """[nbytes] uint8, read-only zero-copy view of the tensor's raw data in the mapping."""
        info = self._info(name)
        return np.frombuffer(self._mm, dtype=np.uint8, count=info.nbytes, offset=info.offset)

    def load_tensor(
        self, name: str, dtype: torch.dtype | None = None, device: str | torch.device = "cpu"
    ) -> torch.Tensor:
        """The tensor dequantized to `dtype` (fp32 if None) on `device`, shaped `shape`, in
        fresh memory."""
        import torch

        from libvllm.engine.gguf.dequant import SUPPORTED_TYPES, dequantize

        info = self._info(name)
        if info.ggml_type not in SUPPORTED_TYPES:
            raise UnsupportedError(
                f"{self.path}: tensor {name!r} has GGML type {info.type_name}, "
                "which the engine cannot dequantize"
            )
        with warnings.catch_warnings():
            # The mapping is read-only; dequantize only reads it and returns fresh memory.
            warnings.filterwarnings("ignore", message="The given buffer is not writable")
            raw = torch.frombuffer(
                self._mm, dtype=torch.uint8, count=info.nbytes, offset=info.offset
            )  # [nbytes] uint8
        raw = raw.to(device)
        return dequantize(raw, info.ggml_type, info.n_elements,
                          dtype or torch.float32).view(info.shape)
