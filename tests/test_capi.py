"""libvllm.so driven through include/vllm.h on the real model.

tests/c/capi_test.c runs every case once (one process, one shared engine); each case
is reported here as its own test. A Python host that imported torch first loads the
library too (cffi's start-up hung there before PyType_Modified), and checks that an
unexpected engine exception becomes VLLM_ERR_INTERNAL without a traceback.
Run as `python tests/test_capi.py LIBRARY MODEL` it is that host.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.capi, pytest.mark.slow]

TESTS = Path(__file__).resolve().parent
CASES = [
    "version",
    "init",
    "missing_model",
    "last_error_copy",
    "null_args",
    "stale_handle",
    "model_info",
    "tokenize_roundtrip",
    "chat_template",
    "generate",
    "stop_token",
    "abort",
    "bad_sampling",
    "default_params",
    "threads",
]


@pytest.fixture(scope="module")
def case_results(compile_c, child_env, model_path) -> dict[str, str]:
    exe = compile_c(TESTS / "c" / "capi_test.c", "-pthread")
    run = subprocess.run(
        [str(exe), model_path], capture_output=True, text=True, env=child_env, timeout=900
    )
    results = {}
    for line in run.stdout.splitlines():
        verdict, _, rest = line.partition(" ")
        name, _, why = rest.partition(": ")
        results[name] = why if verdict == "FAIL" else ""
    assert list(results) == CASES, f"rc={run.returncode}\n{run.stdout}\n{run.stderr}"
    assert "Traceback" not in run.stderr, run.stderr
    return results


@pytest.mark.parametrize("case", CASES)
def test_c_case(case_results, case):
    assert case_results[case] == "", case_results[case]


def test_python_host_with_torch_loaded(built, model_path, child_env):
    run = subprocess.run(
        [sys.executable, __file__, str(built / "libvllm.so"), model_path],
        capture_output=True,
        text=True,
        env=child_env,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "host ok" in run.stdout
    assert "Traceback" not in run.stderr, run.stderr


def python_host(library: str, model: str) -> None:
    """Loads the library into this (torch-using) interpreter and drives it."""
    import cffi
    import torch  # noqa: F401  (before the library starts: the hang this guards against)

    sys.path.insert(0, str(TESTS.parent))
    from libvllm.capi.header import api_cdef

    ffi = cffi.FFI()
    ffi.cdef(api_cdef())
    lib = ffi.dlopen(library)
    params = ffi.new("vllm_engine_params *")
    lib.vllm_engine_params_init(params, ffi.sizeof(params[0]))
    params.max_model_len = 256
    handle = ffi.new("vllm_engine **")
    assert lib.vllm_engine_create(model.encode(), params, handle) == lib.VLLM_OK
    n = ffi.new("size_t *")
    status = lib.vllm_tokenize(handle[0], b"Hello", 5, 1, 1, ffi.NULL, 0, n)
    assert status == lib.VLLM_ERR_BUFFER_TOO_SMALL
    assert n[0] > 0

    import libvllm.engine.llm_engine  # the library's engine lives in this interpreter

    def broken_step(self):
        raise RuntimeError("boom")

    libvllm.engine.llm_engine.LLMEngine.step = broken_step
    assert lib.vllm_request_add(handle[0], b"r", b"Hello", ffi.NULL, 0, ffi.NULL) == lib.VLLM_OK
    outputs, n_outputs = ffi.new("vllm_request_output **"), ffi.new("size_t *")
    assert lib.vllm_engine_step(handle[0], outputs, n_outputs) == lib.VLLM_ERR_INTERNAL
    assert ffi.string(lib.vllm_last_error()) == b"internal error: RuntimeError: boom"
    lib.vllm_engine_free(handle[0])
    lib.vllm_shutdown()
    lib.vllm_shutdown()
    print("host ok")


if __name__ == "__main__":
    python_host(sys.argv[1], sys.argv[2])
