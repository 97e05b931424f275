"""`make install PREFIX=...` and the pkg-config file: a program built only with
`pkg-config --cflags --libs libvllm` against the installed tree links libvllm.so.<major>
and runs; the installed vllm-cli finds the installed library.

One version everywhere: `pkg-config --modversion libvllm` == vllm_version() == the
version setuptools reads for pyproject.toml (dynamic, engine.__version__), at least 1.0
(`pkg-config --atleast-version=1.0`).

Oracle: the installed file layout (prefix/lib, prefix/include, prefix/lib/pkgconfig),
readelf/ldd for what the programs load, examples/c/simple.c answering "Paris", and
setuptools' own reading of pyproject.toml for the version.
Ours (vLLM ships no C library).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from libvllm.capi.header import abi_version

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.capi


@pytest.fixture(scope="module")
def prefix(built, tmp_path_factory) -> Path:
    prefix = tmp_path_factory.mktemp("prefix")
    make = subprocess.run(["make", "-s", "install", f"PREFIX={prefix}"], cwd=ROOT,
                          capture_output=True, text=True)
    assert make.returncode == 0, make.stdout + make.stderr
    return prefix


def _pkg_config(prefix: Path, *args: str) -> str:
    if shutil.which("pkg-config") is None:
        pytest.skip("pkg-config is absent")
    run = subprocess.run(["pkg-config", *args, "libvllm"], capture_output=True, text=True,
                         env={"PKG_CONFIG_PATH": str(prefix / "lib/pkgconfig"),
                              "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def _loaded_libvllm(exe: Path) -> Path:
    """The libvllm file the dynamic loader picks for exe."""
    ldd = subprocess.run(["ldd", str(exe)], capture_output=True, text=True).stdout
    line = next(ln for ln in ldd.splitlines() if "libvllm.so" in ln)
    return Path(line.split("=>")[1].split("(")[0].strip()).resolve()


def test_install_layout(prefix):
    major = abi_version()[0]
    lib = prefix / "lib"
    assert (lib / f"libvllm.so.{major}").is_file()
    assert (lib / "libvllm.so").is_symlink()
    assert (lib / "libvllm.so").resolve() == (lib / f"libvllm.so.{major}").resolve()
    assert (prefix / "include/vllm.h").read_text() == (ROOT / "include/vllm.h").read_text()
    assert (lib / "pkgconfig/libvllm.pc").is_file()
    assert (prefix / "bin/vllm-cli").is_file()


def test_pkg_config_builds_a_program_against_the_installed_library(prefix, tmp_path,
                                                                    child_env, model_path):
    from libvllm import engine

    assert _pkg_config(prefix, "--modversion") == engine.__version__
    flags = _pkg_config(prefix, "--cflags", "--libs").split()
    exe = tmp_path / "simple"
    cc = subprocess.run(["cc", "-std=c11", str(ROOT / "examples/c/simple.c"), "-o", str(exe),
                         *flags], capture_output=True, text=True)
    assert cc.returncode == 0, cc.stderr
    needed = subprocess.run(["readelf", "-d", str(exe)], capture_output=True, text=True).stdout
    assert f"[libvllm.so.{abi_version()[0]}]" in needed
    assert _loaded_libvllm(exe) == (prefix / f"lib/libvllm.so.{abi_version()[0]}").resolve()
    run = subprocess.run([str(exe), model_path, "The capital of France is"],
                         capture_output=True, text=True, env=child_env, timeout=600)
    assert run.returncode == 0 and "Paris" in run.stdout, run.stderr


def test_one_version_in_pkg_config_the_library_and_the_package_metadata(prefix):
    import cffi
    from setuptools.config.pyprojecttoml import read_configuration

    from libvllm.capi.header import api_cdef

    metadata = read_configuration(ROOT / "pyproject.toml")["project"]["version"]
    ffi = cffi.FFI()
    ffi.cdef(api_cdef())
    library = ffi.dlopen(str(prefix / f"lib/libvllm.so.{abi_version()[0]}"))
    assert _pkg_config(prefix, "--modversion") == metadata
    assert ffi.string(library.vllm_version()).decode() == metadata
    at_least = subprocess.run(["pkg-config", "--atleast-version=1.0", "libvllm"],
                              env={"PKG_CONFIG_PATH": str(prefix / "lib/pkgconfig"),
                                   "PATH": "/usr/bin:/bin"})
    assert at_least.returncode == 0, f"version {metadata} is below 1.0"


def test_pkg_config_paths_follow_the_file(prefix):
    """No absolute path in libvllm.pc: every path (and so the rpath) is ${pcfiledir}-relative."""
    text = (prefix / "lib/pkgconfig/libvllm.pc").read_text()
    assert str(prefix) not in text and "${pcfiledir}" in text
    rpaths = [flag.removeprefix("-Wl,-rpath,") for flag in _pkg_config(prefix, "--libs").split()
              if flag.startswith("-Wl,-rpath,")]
    assert [Path(r).resolve() for r in rpaths] == [(prefix / "lib").resolve()]


def test_installed_cli_finds_the_installed_library(prefix, child_env):
    installed = (prefix / f"lib/libvllm.so.{abi_version()[0]}").resolve()
    assert _loaded_libvllm(prefix / "bin/vllm-cli") == installed
    run = subprocess.run([str(prefix / "bin/vllm-cli"), "--help"], capture_output=True,
                         text=True, env=child_env, timeout=60)
    assert run.returncode == 0 and "generate" in run.stdout
