"""engine.gguf.reader: GGUF parsing round-trips, and hostile files fail cleanly.

Oracles: (a) files written by gguf.GGUFWriter and read back by gguf.GGUFReader (metadata
values, tensor offsets/shapes/bytes) with gguf.quants.dequantize for tensor values; (b) the
real SmolLM2-135M Q4_1 model (VLLM_TEST_MODEL or ~/.cache/libvllm/models/), same oracles;
(c) hand-built malformed files (struct-packed here), each of which must raise ModelLoadError
naming the problem, never another exception and never a hang (the caps, general.alignment's
UINT32 type and packed, in-order tensor data are llama.cpp gguf.cpp's rules); plus truncation at
every cut point and random byte corruption of a small valid file. Mirrors llama.cpp
tests/test-gguf.cpp (handcrafted_file_type: bad magic/version/counts/alignment/offsets, not
enough data); tests/test_gguf_fuzz.py mutates real headers at scale.
"""

import os
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from libvllm.engine.errors import ModelLoadError, UnsupportedError
from libvllm.engine.gguf.reader import GGUFReader, GGUFTensorInfo

MODEL = Path(
    os.environ.get(
        "VLLM_TEST_MODEL",
        Path.home() / ".cache/libvllm/models/SmolLM2-135M-Instruct.Q4_1.gguf",
    )
)
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
QT = gguf.GGMLQuantizationType


# --- hand-built GGUF bytes ---------------------------------------------------------------


def s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def kv(key: str, vtype: int, payload: bytes) -> bytes:
    return s(key) + struct.pack("<I", vtype) + payload


def u32(v: int) -> bytes:
    return struct.pack("<I", v)


def arr(etype: int, count: int, payload: bytes = b"") -> bytes:
    return struct.pack("<IQ", etype, count) + payload


def tinfo(name: str | bytes, ne: list[int], ggml_type: int = 0, offset: int = 0) -> bytes:
    dims = b"".join(struct.pack("<Q", d) for d in ne)
    return s(name) + u32(len(ne)) + dims + struct.pack("<IQ", ggml_type, offset)


def build(kvs=(), tensors=(), data=b"", n_tensors=None, n_kv=None, version=3, align=32):
    """Header + kvs + tensor infos, padded to `align`, + data."""
    n_t = len(tensors) if n_tensors is None else n_tensors
    n_k = len(kvs) if n_kv is None else n_kv
    head = b"GGUF" + u32(version) + struct.pack("<QQ", n_t, n_k) + b"".join([*kvs, *tensors])
    return head + bytes(-len(head) % align) + data


VALID_TENSOR = tinfo("w", [4])
VALID_DATA = np.arange(4, dtype=np.float32).tobytes()


def write(tmp_path: Path, content: bytes, name: str = "m.gguf") -> Path:
    path = tmp_path / name
    path.write_bytes(content)
    return path


def make_small_model(path: Path, alignment: int | None = None) -> dict[str, np.ndarray]:
    """A GGUFWriter file with metadata of every type and F32/F16/Q8_0/Q4_0 tensors."""
    rng = np.random.default_rng(0)
    floats = {
        "f32": rng.standard_normal((3, 64)).astype(np.float32),
        "f16": rng.standard_normal(64).astype(np.float16),
        "q8_0": rng.standard_normal((2, 64)).astype(np.float32),
        "q4_0": rng.standard_normal((4, 2, 32)).astype(np.float32),
    }
    w = gguf.GGUFWriter(path, arch="test")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 0.1)
    w.add_uint64("t.u64", 2**64 - 1)
    w.add_int64("t.i64", -(2**63))
    w.add_float64("t.f64", 0.1)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo wörld ✓")
    w.add_string("t.empty", "")
    w.add_array("t.strs", ["a", "", "ü", "<|im_end|>"])
    w.add_array("t.ints", [1, -2, 3])
    w.add_array("t.floats", [0.5, -1.25])
    w.add_array("t.bools", [True, False, True])
    w.add_key_value("t.u8s", [1, 2, 255], gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.UINT8)
    w.add_array("t.nested", [[1, 2], [3]])
    w.add_tensor("f32", floats["f32"])
    w.add_tensor("f16", floats["f16"])
    w.add_tensor("q8_0", gguf.quants.quantize(floats["q8_0"], QT.Q8_0), raw_dtype=QT.Q8_0)
    w.add_tensor("q4_0", gguf.quants.quantize(floats["q4_0"], QT.Q4_0), raw_dtype=QT.Q4_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return floats


def oracle_values(path: Path) -> tuple[dict, dict]:
    """gguf.GGUFReader's view: (metadata without GGUF.* pseudo-keys, tensors by name)."""
    ref = gguf.GGUFReader(path)
    fields = {k: f.contents() for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    return fields, {t.name: t for t in ref.tensors}


def assert_matches_oracle(r: GGUFReader, ref_tensor, dequant_ref: bool = True) -> None:
    info = r.tensors[ref_tensor.name]
    assert info.shape == tuple(int(d) for d in reversed(ref_tensor.shape))
    assert info.ggml_type == int(ref_tensor.tensor_type)
    assert info.type_name == ref_tensor.tensor_type.name
    assert (info.offset, info.nbytes) == (ref_tensor.data_offset, ref_tensor.n_bytes)
    raw = r.tensor_bytes(info.name)
    assert np.array_equal(raw, ref_tensor.data.reshape(-1).view(np.uint8))
    want = gguf.quants.dequantize(ref_tensor.data, ref_tensor.tensor_type)
    got = r.load_tensor(info.name)
    assert got.dtype == torch.float32 and tuple(got.shape) == info.shape
    assert torch.equal(got, torch.from_numpy(np.array(want)).reshape(info.shape))


# --- (a) round trips with gguf.GGUFWriter ------------------------------------------------


@pytest.mark.parametrize("alignment", [None, 64])
def test_writer_round_trip(tmp_path, alignment):
    path = tmp_path / "small.gguf"
    floats = make_small_model(path, alignment)
    ref_fields, ref_tensors = oracle_values(path)
    with GGUFReader(path) as r:
        assert r.version == 3 and r.alignment == (alignment or 32)
        for key, want in ref_fields.items():
            if key != "t.nested":  # gguf.GGUFReader does not decode nested arrays
                assert r.metadata[key] == want, key
        assert r.metadata["t.nested"] == [[1, 2], [3]]
        assert r.metadata["t.f32"] == float(np.float32(0.1))
        assert r.metadata["t.f64"] == 0.1
        assert r.metadata["t.bool"] is True and r.metadata["t.bools"] == [True, False, True]
        assert type(r.metadata["t.u64"]) is int and type(r.metadata["t.ints"][0]) is int
        assert list(r.metadata) == list(ref_fields)
        assert list(r.tensors) == ["f32", "f16", "q8_0", "q4_0"]
        for t in ref_tensors.values():
            assert_matches_oracle(r, t)
        assert torch.equal(r.load_tensor("f32"), torch.from_numpy(floats["f32"]))
        assert torch.equal(r.load_tensor("f16", torch.float16), torch.from_numpy(floats["f16"]))
        assert r.tensors["q4_0"].shape == (4, 2, 32)


def test_tensor_bytes_is_zero_copy_view(tmp_path):
    path = tmp_path / "small.gguf"
    floats = make_small_model(path)
    r = GGUFReader(path)
    raw = r.tensor_bytes("f32")
    assert raw.dtype == np.uint8 and not raw.flags.owndata and not raw.flags.writeable
    assert raw.nbytes == r.tensors["f32"].nbytes == 3 * 64 * 4
    r.close()  # views stay valid after close
    assert np.array_equal(raw.view(np.float32), floats["f32"].reshape(-1))
    with pytest.raises(ModelLoadError, match="closed"):
        r.load_tensor("f32")


def test_tensor_info_and_errors_on_lookup(tmp_path):
    r = GGUFReader(write(tmp_path, build(tensors=[VALID_TENSOR], data=VALID_DATA)))
    assert r.tensors["w"] == GGUFTensorInfo("w", (4,), 0, "F32", 64, 16)
    assert r.load_tensor("w", torch.float64).tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(ModelLoadError, match="no tensor named 'x'"):
        r.load_tensor("x")


@pytest.mark.parametrize("ggml_type", [QT.NVFP4, QT.Q8_1, QT.I32, QT.Q1_0])
def test_unimplemented_type_parses_but_load_is_unsupported(tmp_path, ggml_type):
    block, size = gguf.GGML_QUANT_SIZES[ggml_type]
    content = build(tensors=[tinfo("blk.0.x", [block], int(ggml_type))], data=bytes(size))
    r = GGUFReader(write(tmp_path, content))
    assert r.tensors["blk.0.x"].type_name == ggml_type.name
    with pytest.raises(UnsupportedError, match=f"'blk.0.x'.*{ggml_type.name}"):
        r.load_tensor("blk.0.x")


def test_zero_dim_tensor_and_no_tensors(tmp_path):
    r = GGUFReader(write(tmp_path, build(tensors=[tinfo("s", [])], data=VALID_DATA[:4])))
    assert r.tensors["s"].shape == () and r.load_tensor("s").item() == 0.0
    assert GGUFReader(write(tmp_path, b"GGUF" + u32(2) + bytes(16), "e.gguf")).tensors == {}


# --- (b) the real model --------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_model():
    if not MODEL.is_file():
        pytest.skip(f"{MODEL} absent (the Makefile fetches it)")
    return GGUFReader(MODEL), gguf.GGUFReader(MODEL)


@pytest.mark.slow
def test_real_model(real_model):
    r, ref = real_model
    assert len(r.tensors) == 272 and r.metadata["general.architecture"] == "llama"
    assert r.metadata["tokenizer.ggml.tokens"] == ref.fields["tokenizer.ggml.tokens"].contents()
    assert r.metadata["tokenizer.ggml.merges"][:100] == ref.fields[
        "tokenizer.ggml.merges"
    ].contents(slice(0, 100))
    ref_tensors = {t.name: t for t in ref.tensors}
    assert [t.name for t in ref.tensors] == list(r.tensors)
    for name in ("token_embd.weight", "blk.0.ffn_down.weight", "blk.3.attn_norm.weight"):
        assert_matches_oracle(r, ref_tensors[name])
    assert {r.tensors[n].type_name for n in ("token_embd.weight", "blk.0.ffn_down.weight")} == {
        "Q8_0",
        "Q4_1",
    }


@pytest.mark.slow
def test_real_model_truncated_header(real_model, tmp_path):
    r, _ = real_model
    header_end = min(t.offset for t in r.tensors.values())
    head = MODEL.read_bytes()[:header_end]
    for cut in np.linspace(0, header_end - 1, 12, dtype=int):
        with pytest.raises(ModelLoadError):
            GGUFReader(write(tmp_path, head[:cut]))


# --- (c) hostile files -------------------------------------------------------------------

HUGE = 2**63 + 5
MALFORMED = {
    "empty": (b"", "empty file"),
    "bad magic": (b"GGML" + build()[4:], "bad magic"),
    "version 1": (build(version=1), "unsupported GGUF version 1"),
    "version 4": (build(version=4), "unsupported GGUF version 4"),
    "big-endian": (b"GGUF" + struct.pack(">I", 3) + bytes(16), "big-endian"),
    "short header": (b"GGUF" + u32(3) + bytes(3), "truncated"),
    "huge tensor count": (build(n_tensors=HUGE), "tensor count"),
    "huge kv count": (build(n_kv=2**40), "metadata count"),
    "huge key length": (build([struct.pack("<Q", 2**60) + bytes(16)]), "exceeds the limit"),
    "key past end": (build([struct.pack("<Q", 1000) + b"abc"]), "truncated"),
    "huge string value": (build([kv("k", STR, struct.pack("<Q", HUGE))]), "exceeds the limit"),
    "huge array length": (build([kv("k", ARR, arr(U32, 2**61))]), "metadata limit"),
    "huge string array": (build([kv("k", ARR, arr(STR, 2**40))]), "metadata limit"),
    "array past end": (build([kv("k", ARR, arr(U32, 1000))]), "cannot fit"),
    "string array past end": (build([kv("k", ARR, arr(STR, 1000))]), "cannot fit"),
    "string array, bad utf-8 second": (build([kv("k", ARR, arr(STR, 2, s("a") + s(b"\xc3")))]),
                                       "'k' is not valid UTF-8"),
    "string array, huge second": (
        build([kv("k", ARR, arr(STR, 2, s("a") + struct.pack("<Q", HUGE)))]), "exceeds the limit"),
    "string array, second past end": (
        build([kv("k", ARR, arr(STR, 2, s("a") + struct.pack("<Q", 1000) + b"abcdefgh"))]),
        "truncated: 'k' needs 1000 bytes"),
    "arrays over the element limit": (
        build([kv("a", ARR, arr(U8, 2**21, bytes(2**21))), kv("b", ARR, arr(U8, 2**21 + 1))]),
        "metadata limit",
    ),
    "tensor count over the limit": (build(n_tensors=2**16 + 1), "exceeds the limit of 65536"),
    "kv count over the limit": (build(n_kv=2**16 + 1), "exceeds the limit of 65536"),
    "bad value type": (build([kv("k", 13, b"")]), "unknown value type 13"),
    "bad array element type": (build([kv("k", ARR, arr(99, 1))]), "unknown value type 99"),
    "arrays nested 3 deep": (build([kv("k", ARR, arr(ARR, 1, arr(ARR, 1, arr(U8, 0))))]), "nested"),
    "bool 2": (build([kv("k", BOOL, b"\x02")]), "neither 0 nor 1"),
    "bool array 7": (build([kv("k", ARR, arr(BOOL, 2, b"\x01\x07"))]), "other than 0 or 1"),
    "bad utf-8 key": (build([s(b"\xff\xfe") + u32(U8) + b"\x00"]), "UTF-8"),
    "duplicate key": (build([kv("k", U8, b"\x01"), kv("k", U8, b"\x02")]), "duplicate metadata"),
    "alignment 0": (build([kv("general.alignment", U32, u32(0))]), "power of two"),
    "alignment 48": (build([kv("general.alignment", U32, u32(48))]), "power of two"),
    "alignment string": (build([kv("general.alignment", STR, s("32"))]), "power of two"),
    "alignment UINT64": (build([kv("general.alignment", U64, struct.pack("<Q", 32))]), "UINT32"),
    "n_dims 5": (build(tensors=[tinfo("w", [1, 1, 1, 1, 1])]), "5 dims"),
    "dims 2^42": (build(tensors=[tinfo("w", [2**42, 2**42])]), "overflow"),
    "dim 2^64-1": (build(tensors=[tinfo("w", [2**64 - 1])]), "overflow"),
    "zero dim": (build(tensors=[tinfo("w", [4, 0])]), "zero dimension"),
    "offset far past end": (build(tensors=[tinfo("w", [4], offset=2**40)], data=VALID_DATA), "0"),
    "gap before data": (build(tensors=[tinfo("w", [4], offset=32)], data=bytes(64)), "not 0"),
    "overlapping tensors": (
        build(tensors=[tinfo("a", [4]), tinfo("b", [4])], data=bytes(64)),
        "'b' data offset 0 is not 32",
    ),
    "tensors out of order": (
        build(tensors=[tinfo("a", [4], offset=32), tinfo("b", [4])], data=bytes(64)),
        "'a' data offset 32 is not 0",
    ),
    "second tensor past end": (
        build(tensors=[tinfo("a", [4]), tinfo("b", [4], offset=32)], data=bytes(40)),
        "'b' data \\[.*past the end",
    ),
    "data past end": (build(tensors=[VALID_TENSOR], data=VALID_DATA[:15]), "past the end"),
    "misaligned offset": (build(tensors=[tinfo("w", [4], offset=4)], data=bytes(64)), "alignment"),
    "duplicate tensor": (build(tensors=[VALID_TENSOR] * 2, data=bytes(64)), "duplicate tensor"),
    "unknown ggml type": (build(tensors=[tinfo("w", [4], 99)], data=VALID_DATA), "unknown GGML"),
    "removed ggml type": (build(tensors=[tinfo("w", [32], 4)], data=bytes(64)), "Q4_2"),
    "row not whole blocks": (build(tensors=[tinfo("w", [16, 2], 8)], data=bytes(64)), "block"),
    "name of 64 bytes": (build(tensors=[tinfo("n" * 64, [4])], data=VALID_DATA), "exceeds"),
    "empty name": (build(tensors=[tinfo("", [4])], data=VALID_DATA), "empty tensor name"),
    "bad utf-8 name": (build(tensors=[tinfo(b"\xc3", [4])], data=VALID_DATA), "UTF-8"),
}


@pytest.mark.parametrize("content, message", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_raises_model_load_error(tmp_path, content, message):
    path = write(tmp_path, content)
    with pytest.raises(ModelLoadError, match=message) as err:
        GGUFReader(path)
    assert str(err.value).startswith(f"{path}: ")


def test_limits_are_inclusive(tmp_path):
    name = "n" * 63
    nested = kv("k", ARR, arr(ARR, 2, arr(U8, 1, b"\x07") + arr(STR, 1, s("x"))))
    content = build([nested, kv("b", BOOL, b"\x00")], [tinfo(name, [4])], VALID_DATA)
    r = GGUFReader(write(tmp_path, content))
    assert r.metadata == {"k": [[7], ["x"]], "b": False} and list(r.tensors) == [name]


def test_every_truncation_of_a_small_file(tmp_path):
    path = tmp_path / "small.gguf"
    make_small_model(path)
    content = path.read_bytes()
    data_end = max(t.offset + t.nbytes for t in GGUFReader(path).tensors.values())
    for cut in range(data_end):
        with pytest.raises(ModelLoadError):
            GGUFReader(write(tmp_path, content[:cut], "cut.gguf"))


def test_random_corruption_fails_cleanly(tmp_path):
    path = tmp_path / "small.gguf"
    make_small_model(path)
    content = np.frombuffer(path.read_bytes(), dtype=np.uint8)
    header_end = GGUFReader(path).tensors["f32"].offset
    rng = np.random.default_rng(1)
    for _ in range(300):
        bad = content.copy()
        at = rng.integers(0, header_end, size=rng.integers(1, 4))
        bad[at] = rng.integers(0, 256, size=at.size)
        try:
            r = GGUFReader(write(tmp_path, bad.tobytes(), "bad.gguf"))
        except ModelLoadError:
            continue
        for name in r.tensors:
            try:
                r.load_tensor(name)
            except UnsupportedError:
                pass


def test_missing_file(tmp_path):
    with pytest.raises(ModelLoadError, match="no such file"):
        GGUFReader(tmp_path / "absent.gguf")


def test_directory(tmp_path):
    with pytest.raises(ModelLoadError, match="is a directory"):
        GGUFReader(tmp_path)


def test_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo.gguf"
    os.mkfifo(fifo)
    with pytest.raises(ModelLoadError, match="not a regular file"):
        GGUFReader(fifo)
