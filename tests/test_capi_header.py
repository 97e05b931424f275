"""include/vllm.h vs build/libvllm.so: exported symbols, C/C++ compilation, versions,
defaults and status codes, and the pure-C functions working without Python."""

from __future__ import annotations

import subprocess
from pathlib import Path

import cffi
import pytest

from libvllm.capi.header import HEADER, abi_version, api_cdef, api_functions
from libvllm.engine import errors
from libvllm.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.capi

TESTS_C = Path(__file__).resolve().parent / "c"
STRICT = ["-Wall", "-Wextra", "-Werror", "-pedantic", "-fsyntax-only"]


@pytest.fixture(scope="module")
def abi(built):
    """The library loaded in ABI mode: only pure-C functions are called on it."""
    ffi = cffi.FFI()
    ffi.cdef(api_cdef())
    return ffi, ffi.dlopen(str(built / "libvllm.so"))


def _exported(library: Path) -> set[str]:
    nm = subprocess.run(
        ["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True, check=True
    )
    return {line.split()[-1] for line in nm.stdout.splitlines() if line.strip()}


def test_exports_are_exactly_the_header_functions(built):
    declared = api_functions()
    assert len(declared) == len(set(declared)) >= 20
    assert _exported(built / "libvllm.so") == set(declared)  # the loader (capi/loader.c)
    runtime = next(built.glob("libvllm-python.so.*"))
    assert _exported(runtime) == set(declared) | {"PyInit__libvllm", "libvllm_runtime_configure"}


def test_soname_carries_the_abi_major(built):
    major = abi_version()[0]
    dyn = subprocess.run(
        ["readelf", "-d", str(built / "libvllm.so")], capture_output=True, text=True, check=True
    ).stdout
    assert f"[libvllm.so.{major}]" in dyn


@pytest.mark.parametrize(
    "compiler",
    [["cc", f"-std={std}", "-x", "c"] for std in ("c89", "c99", "c11", "c17")]
    + [["c++", f"-std={std}", "-x", "c++"] for std in ("c++98", "c++11", "c++17", "c++20")],
    ids=["c89", "c99", "c11", "c17", "c++98", "c++11", "c++17", "c++20"],
)
def test_header_compiles_strictly(compiler):
    result = subprocess.run([*compiler, *STRICT, str(HEADER)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_abi_version_matches_header_macros(abi):
    _, lib = abi
    major, minor = abi_version()
    assert (major, minor) == (1, 3)
    assert lib.vllm_abi_version() == (major << 16) | minor


def test_version_is_the_package_version(abi):
    from libvllm import engine

    ffi, lib = abi
    assert ffi.string(lib.vllm_version()).decode() == engine.__version__


def test_status_codes_match_engine_errors(abi):
    ffi, lib = abi
    for cls, code in [
        (errors.VllmError, lib.VLLM_ERR_INTERNAL),
        (errors.InvalidArgumentError, lib.VLLM_ERR_INVALID_ARGUMENT),
        (errors.ModelLoadError, lib.VLLM_ERR_MODEL_LOAD),
        (errors.UnsupportedError, lib.VLLM_ERR_UNSUPPORTED),
        (errors.NotFoundError, lib.VLLM_ERR_NOT_FOUND),
        (errors.OutOfResourcesError, lib.VLLM_ERR_OUT_OF_RESOURCES),
    ]:
        assert cls.status == code, cls.__name__
    names = [ffi.string(lib.vllm_status_string(i)).decode() for i in range(10)]
    assert names[0] == "VLLM_OK" and names[9] == "VLLM_ERR_INTERNAL"
    assert ffi.string(lib.vllm_status_string(-1)).decode() == "VLLM_ERR_UNKNOWN"


def test_sampling_params_defaults_match_vllm(abi):
    ffi, lib = abi
    p = ffi.new("vllm_sampling_params *")
    lib.vllm_sampling_params_init(p, ffi.sizeof(p[0]))
    want = SamplingParams()
    assert p.struct_size == ffi.sizeof("vllm_sampling_params")
    for name in (
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "ignore_eos",
        "skip_special_tokens",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "min_tokens",
        "include_stop_str_in_output",
        "n",
    ):
        assert getattr(p, name) == getattr(want, name), name
    assert p.logprobs == -1 and want.logprobs is None  # -1: none (since 1.0)
    assert not p.has_seed and want.seed is None
    assert p.n_stop_token_ids == 0 and p.stop_token_ids == ffi.NULL
    assert p.n_stop == p.n_logit_bias == p.n_bad_words == p.n_allowed_token_ids == 0
    assert p.allowed_token_ids == ffi.NULL and want.allowed_token_ids is None


def test_last_error_copy_without_error(abi):
    ffi, lib = abi
    buf = ffi.new("char[4]", b"xyz")
    assert lib.vllm_last_error_copy(buf, 4) == 0
    assert ffi.string(buf) == b""


def test_pure_c_functions_need_no_python(compile_c, child_env, tmp_path):
    exe = compile_c(TESTS_C / "no_python.c")
    env = {**child_env, "LIBVLLM_PYTHON": str(tmp_path / "no" / "python")}
    run = subprocess.run([str(exe)], capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert str(tmp_path / "no" / "python") in run.stdout
    assert "Traceback" not in run.stderr
