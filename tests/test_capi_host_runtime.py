"""libvllm as a good citizen of its host process: signals stay the
host's, OpenMP threads sleep between calls, vllm_engine_params.n_threads (ABI 0.5) sets
torch's thread count, and no start-up failure ends the host (tests/c/host_test.c).

Oracle: POSIX signal semantics (the host's handler runs; SIG_DFL SIGINT ends the
process), libgomp's OMP_WAIT_POLICY contract (a user's value wins), torch's
get_num_threads. Ours (vLLM ships no C library).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTS_C = Path(__file__).resolve().parent / "c"

pytestmark = pytest.mark.capi


@pytest.fixture(scope="module")
def host(compile_c) -> Path:
    return compile_c(TESTS_C / "host_test.c")


def _run(cmd, env, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env,
                          timeout=timeout)


def test_sigint_reaches_the_host_handler_and_the_library_keeps_working(host, child_env,
                                                                       model_path):
    run = _run([host, "sigint", model_path], child_env)
    assert run.returncode == 0 and run.stdout.strip() == "PASS", run.stdout + run.stderr
    assert "KeyboardInterrupt" not in run.stderr


def test_sigint_stays_default_after_init(host, child_env):
    run = _run([host, "default"], child_env)
    assert run.returncode == 0 and run.stdout.strip() == "PASS", run.stdout + run.stderr


@pytest.mark.slow
def test_ctrl_c_ends_a_host_blocked_in_request_next(host, child_env, model_path):
    proc = subprocess.Popen([str(host), "blocked", model_path], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=child_env)
    try:
        assert proc.stdout.readline().strip() == "READY", proc.stderr.read()
        time.sleep(1.0)  # streaming: the main thread waits in vllm_request_next
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == -signal.SIGINT
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in proc.stderr.read()


@pytest.mark.parametrize("preset", [None, "active"])
def test_openmp_threads_wait_passively_unless_the_user_chose(host, child_env, preset):
    env = {k: v for k, v in child_env.items() if k != "OMP_WAIT_POLICY"}
    if preset:
        env["OMP_WAIT_POLICY"] = preset
    run = _run([host, "init"], env)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[0] == f"VLLM_OK {preset or 'PASSIVE'}"


def test_a_system_exit_while_loading_the_glue_does_not_end_the_host(host, child_env, tmp_path):
    (tmp_path / "libvllm/capi").mkdir(parents=True)
    (tmp_path / "libvllm/__init__.py").write_text("")
    (tmp_path / "libvllm/capi/__init__.py").write_text("")
    (tmp_path / "libvllm/capi/glue.py").write_text("raise SystemExit(3)\n")
    run = _run([host, "init"], {**child_env, "LIBVLLM_SOURCE_DIR": str(tmp_path)})
    assert run.returncode == 0, run.stderr
    status, message = run.stdout.split("\n")[:2]
    assert status.startswith("VLLM_ERR_RUNTIME_INIT")
    # the runtime's message names what it loaded, then which python ran it
    assert message.startswith(f"cannot load libvllm's Python side from {tmp_path}: "
                              "SystemExit: 3 (python: ")


def test_a_system_exit_while_python_starts_does_not_end_the_host(host, child_env, tmp_path):
    (tmp_path / "sitecustomize.py").write_text("raise SystemExit(4)\n")
    run = _run([host, "init"], {**child_env, "PYTHONPATH": str(tmp_path)})
    assert run.returncode == 0, run.stderr
    status, message = run.stdout.split("\n")[:2]
    assert status.startswith("VLLM_ERR_RUNTIME_INIT")
    assert message.startswith("cannot start Python from ")


_N_THREADS = """
import sys
import cffi
import torch
from libvllm.capi.header import api_cdef
ffi = cffi.FFI()
ffi.cdef(api_cdef())
lib = ffi.dlopen(sys.argv[1])
params = ffi.new("vllm_engine_params *")
lib.vllm_engine_params_init(params, ffi.sizeof(params[0]))
out = ffi.new("vllm_engine **")
for n in (-1, 1):
    params.n_threads = n
    status = lib.vllm_engine_create(sys.argv[2].encode(), params, out)
    print(status, ffi.string(lib.vllm_last_error()).decode(), torch.get_num_threads())
lib.vllm_engine_free(out[0])
lib.vllm_shutdown()
"""


def test_n_threads_sets_torch_threads(built, child_env, model_path):
    # no OMP_NUM_THREADS (tests/conftest.py sets 1): the child starts with torch's default
    env = {k: v for k, v in child_env.items() if k != "OMP_NUM_THREADS"}
    run = _run([sys.executable, "-c", _N_THREADS, built / "libvllm.so", model_path],
               {**env, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr
    invalid, valid = run.stdout.strip().split("\n")
    assert invalid.startswith("1 n_threads must be >= 0, got -1")
    assert valid == "0  1"
