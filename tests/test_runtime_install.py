"""The self-locating runtime (capi/loader.c): `make install PREFIX=p` from a copy of the
checkout whose own .venv is then deleted with the copy; a C program built with only
`pkg-config --cflags --libs libvllm` against p runs from `/` under `env -i` with
LIBVLLM_PYTHON naming this environment's python and answers the default question; the
same after `mv p q` and a rebuild. Neither installed library links libpython, holds a
RUNPATH or names the build tree; without LIBVLLM_PYTHON the error names every place it
looked and the variable.

Oracle: "Paris", the answer of examples/c/chat.c with the default model (as `make run`);
readelf for what the libraries need. Ours (vLLM ships no C library).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from install_checkout import QUESTION, bare_env, build_chat, copy_sources, layered_venv

from libvllm.capi.header import abi_version

MAJOR = abi_version()[0]

pytestmark = [pytest.mark.capi, pytest.mark.slow]


def _copy_checkout(dest: Path) -> Path:
    """A fresh checkout with its own .venv: a new virtual environment that sees this
    one's packages through a .pth line (deleted with the copy)."""
    copy_sources(dest)
    layered_venv(dest / ".venv", "shared-environment.pth")
    (dest / ".venv/.stamp-install").touch()
    return dest


def _chat(exe: Path, model_path: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(["env", "-i", *(f"{k}={v}" for k, v in bare_env(**extra).items()),
                           str(exe), model_path, QUESTION], cwd="/", capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(the prefix, the deleted copy it was built from)."""
    if shutil.which("pkg-config") is None:
        pytest.skip("pkg-config is absent")
    work = tmp_path_factory.mktemp("runtime")
    src = _copy_checkout(work / "src")
    make = subprocess.run(["make", "-s", "install", f"PREFIX={work / 'p'}"], cwd=src,
                          capture_output=True, text=True, env=bare_env())
    assert make.returncode == 0, make.stdout + make.stderr
    shutil.rmtree(src)
    return work / "p", src


def test_installed_libraries_link_no_libpython_and_name_no_build_path(installed):
    prefix, src = installed
    for name in (f"libvllm.so.{MAJOR}", f"libvllm-python.so.{MAJOR}"):
        library = prefix / "lib" / name
        dynamic = subprocess.run(["readelf", "-d", str(library)], capture_output=True,
                                 text=True, check=True).stdout
        assert "libpython" not in dynamic and "RUNPATH" not in dynamic
        assert "RPATH" not in dynamic
        assert str(src).encode() not in library.read_bytes()


def test_runs_from_root_with_only_libvllm_python_then_after_a_move(installed, model_path,
                                                                    tmp_path):
    prefix, _src = installed
    exe = build_chat(prefix / "lib/pkgconfig", tmp_path / "chat")
    run = _chat(exe, model_path, LIBVLLM_PYTHON=sys.executable)
    assert run.returncode == 0, run.stderr
    assert "Paris" in run.stdout
    moved = prefix.with_name("q")
    prefix.rename(moved)
    try:
        exe = build_chat(moved / "lib/pkgconfig", tmp_path / "chat-moved")
        run = _chat(exe, model_path, LIBVLLM_PYTHON=sys.executable)
        assert run.returncode == 0, run.stderr
        assert "Paris" in run.stdout
    finally:
        moved.rename(prefix)


def test_without_a_python_the_error_says_where_it_looked(installed, model_path, tmp_path):
    prefix, src = installed
    exe = build_chat(prefix / "lib/pkgconfig", tmp_path / "chat")
    run = _chat(exe, model_path)
    assert run.returncode == 1
    # the cfg's python (the deleted copy's .venv) and PREFIX/bin/python3.X were tried
    assert str(src / ".venv") in run.stderr and str(prefix / "bin") in run.stderr
    assert "LIBVLLM_PYTHON" in run.stderr
    bad = _chat(exe, model_path, LIBVLLM_PYTHON=str(tmp_path / "no-python"))
    assert bad.returncode == 1 and f"LIBVLLM_PYTHON={tmp_path / 'no-python'}" in bad.stderr
