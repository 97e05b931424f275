"""The examples the README shows are built and run as a user would run them.

examples/c/simple.c (caller-driven step()) gives the oracle: its greedy 32-token text for
PROMPT, which must contain "Paris". examples/c/batched.c (8 requests on the background
loop, push callbacks, one abort), examples/go (cgo, pull into a channel), examples/rust
(safe wrapper with Drop; Go and Rust find libvllm through pkg-config, build/libvllm.pc)
and examples/python (ctypes, also in a host that imported torch first) must print that
same greedy text. The ctypes structs of examples/python must have
the header's layout (oracle: cffi's layout of the vllm.h declarations).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "The capital of France is"

pytestmark = pytest.mark.capi


def _run(cmd, env, cwd=None, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=timeout)


@pytest.fixture(scope="module")
def greedy_text(compile_c, child_env, model_path) -> str:
    exe = compile_c(ROOT / "examples/c/simple.c")
    run = _run([exe, model_path, PROMPT], child_env)
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    assert run.stdout.endswith("\n")
    return run.stdout[:-1]


def _streamed_text(stdout: str) -> str:
    """The text an example printed before its final "\\n[N tokens...]" line."""
    text, sep, _ = stdout.rpartition("\n[")
    assert sep, stdout
    return text


def test_simple_c_example_streams_the_greedy_completion(greedy_text):
    assert "Paris" in greedy_text


def test_simple_c_example_reports_a_missing_model(compile_c, child_env, tmp_path):
    exe = compile_c(ROOT / "examples/c/simple.c")
    run = _run([exe, tmp_path / "nope.gguf", "hi"], child_env)
    assert run.returncode == 1
    assert run.stderr.startswith("create: model path does not exist")


def test_batched_c_example(compile_c, child_env, model_path, greedy_text):
    exe = compile_c(ROOT / "examples/c/batched.c", "-pthread")
    _check_batched(_run([exe, model_path, PROMPT], child_env), greedy_text)


def test_batched_c_example_with_the_engine_core_in_a_child(compile_c, child_env, model_path,
                                                           greedy_text):
    """A C host (sys.executable is not a python there) starts the engine-core child with
    the environment's python; same outputs; the child is gone once the host exits."""
    exe = compile_c(ROOT / "examples/c/batched.c", "-pthread")
    env = {**child_env, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    proc = subprocess.Popen([str(exe), model_path, PROMPT], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    stdout, stderr = proc.communicate(timeout=600)
    _check_batched(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr),
                   greedy_text)
    deadline = time.monotonic() + 5
    while _core_children(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _core_children(proc.pid)


def _core_children(parent_pid: int) -> list[int]:
    """Live engine-core processes started by parent_pid (their --parent-pid)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            parent = argv[argv.index(b"--parent-pid") + 1]
        except (OSError, ValueError, IndexError):
            continue
        if b"libvllm.engine.engine_core.engine_core_proc" in argv and \
                parent == str(parent_pid).encode():
            found.append(int(entry.name))
    return found


def _check_batched(run: subprocess.CompletedProcess, greedy_text: str) -> None:
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    heads = re.findall(r"^\[req-(\d)\] (.*) -> finish=(\w+) tokens=(\d+)$", run.stdout, re.M)
    assert [int(h[0]) for h in heads] == list(range(8)), run.stdout
    reasons = {int(i): (reason, int(n)) for i, _, reason, n in heads}
    assert reasons[5][0] == "abort" and 4 <= reasons[5][1] < 200
    assert all(reasons[i][0] in ("stop", "length") for i in range(8) if i != 5), reasons
    assert reasons[6][1] <= 8
    assert len({params for _, params, _, _ in heads}) == 8  # all different
    greedy = run.stdout.split("\n", 1)[1].split("\n[req-1]")[0]
    assert greedy == greedy_text


def test_go_example(built, child_env, model_path, greedy_text, tmp_path):
    if shutil.which("go") is None:
        pytest.skip("go is absent (`make test` installs Debian's golang-go)")
    exe = tmp_path / "generate-go"
    env = {**child_env, "GOFLAGS": "-mod=mod", "CGO_ENABLED": "1", "PKG_CONFIG_PATH": str(built)}
    env.setdefault("GOCACHE", str(tmp_path / "gocache"))
    build = _run(["go", "build", "-o", exe, "."], env, cwd=ROOT / "examples/go")
    assert build.returncode == 0, build.stderr
    run = _run([exe, model_path, PROMPT], child_env)
    assert run.returncode == 0, run.stderr
    assert _streamed_text(run.stdout) == greedy_text
    assert "Traceback" not in run.stderr


def test_rust_example(built, child_env, model_path, greedy_text, tmp_path):
    if shutil.which("cargo") is None:
        pytest.skip("cargo is absent")
    if subprocess.run(["cargo", "--version"], capture_output=True).returncode != 0:
        # rustup's proxy without a toolchain (e.g. a HOME other than the one rustup set up)
        pytest.skip("cargo has no usable Rust toolchain (`cargo --version` fails)")
    env = {**child_env, "CARGO_TARGET_DIR": str(tmp_path / "target"), "PKG_CONFIG_PATH": str(built)}
    build = _run(["cargo", "build", "--offline", "--release", "-q"], env,
                 cwd=ROOT / "examples/rust")
    assert build.returncode == 0, build.stderr
    run = _run([tmp_path / "target/release/generate", model_path, PROMPT], child_env)
    assert run.returncode == 0, run.stderr
    assert _streamed_text(run.stdout) == greedy_text
    assert re.search(r"\n\[\d+ tokens, finish=(stop|length)\]\n$", run.stdout), run.stdout


# The host: plain; one that runs torch when it loads the library; one where torch cannot be
# imported at all, with the engine core in a child (which imports torch itself).
_HOSTS = {"plain": ("", {}),
          "torch-imported-first": ("import torch; ", {}),
          "torch-blocked-core-in-child": ("sys.modules['torch'] = None; ",
                                          {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"})}


@pytest.mark.parametrize("host", list(_HOSTS))
def test_python_ctypes_example(built, child_env, model_path, greedy_text, host):
    script = ROOT / "examples/python/generate.py"
    prelude, env = _HOSTS[host]
    cmd = [sys.executable, script, model_path, PROMPT]
    if prelude:
        cmd[1:1] = ["-c", f"import runpy, sys; {prelude}sys.path.insert(0, sys.argv[1]); "
                    "sys.argv = sys.argv[2:]; runpy.run_path(sys.argv[0], run_name='__main__')",
                    script.parent]
    run = _run(cmd, {**child_env, **env})
    assert run.returncode == 0, run.stdout + run.stderr
    assert _streamed_text(run.stdout) == greedy_text
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize("folder,module,structs", [
    ("examples/python", "vllm_ctypes", ["EngineParams", "SamplingParams", "Event", "Metrics"]),
    ("examples/server", "libvllm_ctypes", ["EngineParams", "Metrics"])])
def test_python_ctypes_structs_match_the_header(folder, module, structs):
    import ctypes
    import importlib

    import cffi

    from libvllm.capi.header import api_cdef

    sys.path.insert(0, str(ROOT / folder))
    try:
        mod = importlib.import_module(module)
    finally:
        sys.path.pop(0)
    ffi = cffi.FFI()
    ffi.cdef(api_cdef())
    c_names = {"EngineParams": "vllm_engine_params", "SamplingParams": "vllm_sampling_params",
               "Event": "vllm_event", "Metrics": "vllm_metrics"}
    for c_name, struct in [(c_names[n], getattr(mod, n)) for n in structs]:
        fields = [name for name, _ in ffi.typeof(c_name).fields]
        assert [name for name, *_ in struct._fields_] == fields, c_name
        assert ctypes.sizeof(struct) == ffi.sizeof(c_name), c_name
        for name in fields:
            assert getattr(struct, name).offset == ffi.offsetof(c_name, name), (c_name, name)
