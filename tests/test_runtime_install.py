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

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from capi.header import abi_version

ROOT = Path(__file__).resolve().parent.parent
QUESTION = "What is the capital of France?"
SOURCES = ["Makefile", "pyproject.toml", "setup.py", "capi", "engine", "kernels", "include",
           "examples/c", "examples/cli"]
MAJOR = abi_version()[0]

pytestmark = [pytest.mark.capi, pytest.mark.slow]


def _copy_checkout(dest: Path) -> Path:
    """A fresh checkout with its own .venv: a new virtual environment that sees this
    one's packages through a .pth line (deleted with the copy)."""
    for name in SOURCES:
        source, target = ROOT / name, dest / name
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    venv = dest / ".venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = subprocess.run([str(venv / "bin/python"), "-c", "import sysconfig; print(sysconfig."
                           "get_paths()['purelib'])"], capture_output=True, text=True,
                          check=True).stdout.strip()
    Path(site, "shared-environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (venv / ".stamp-install").touch()
    return dest


def _env(**extra: str) -> dict[str, str]:
    return {"HOME": os.environ.get("HOME", "/root"), "PATH": "/usr/bin:/bin", **extra}


def _build_chat(prefix: Path, out: Path) -> Path:
    env = _env(PKG_CONFIG_PATH=str(prefix / "lib/pkgconfig"))
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "libvllm"], env=env,
                           capture_output=True, text=True)
    assert flags.returncode == 0, flags.stderr
    cc = subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", str(ROOT / "examples/c/chat.c"),
                         "-o", str(out), *flags.stdout.split()], capture_output=True, text=True)
    assert cc.returncode == 0, cc.stderr
    return out


def _chat(exe: Path, model_path: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(["env", "-i", *(f"{k}={v}" for k, v in _env(**extra).items()),
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
                          capture_output=True, text=True, env=_env())
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
    exe = _build_chat(prefix, tmp_path / "chat")
    run = _chat(exe, model_path, LIBVLLM_PYTHON=sys.executable)
    assert run.returncode == 0, run.stderr
    assert "Paris" in run.stdout
    moved = prefix.with_name("q")
    prefix.rename(moved)
    try:
        exe = _build_chat(moved, tmp_path / "chat-moved")
        run = _chat(exe, model_path, LIBVLLM_PYTHON=sys.executable)
        assert run.returncode == 0, run.stderr
        assert "Paris" in run.stdout
    finally:
        moved.rename(prefix)


def test_without_a_python_the_error_says_where_it_looked(installed, model_path, tmp_path):
    prefix, src = installed
    exe = _build_chat(prefix, tmp_path / "chat")
    run = _chat(exe, model_path)
    assert run.returncode == 1
    # the cfg's python (the deleted copy's .venv) and PREFIX/bin/python3.X were tried
    assert str(src / ".venv") in run.stderr and str(prefix / "bin") in run.stderr
    assert "LIBVLLM_PYTHON" in run.stderr
    bad = _chat(exe, model_path, LIBVLLM_PYTHON=str(tmp_path / "no-python"))
    assert bad.returncode == 1 and f"LIBVLLM_PYTHON={tmp_path / 'no-python'}" in bad.stderr
