"""Lays out an installation of libvllm: `make install` (a prefix) and the wheel.

    .venv/bin/python capi/install.py --prefix /usr/local [--destdir DIR]

PREFIX/lib/libvllm.so.<major> (+ libvllm.so; the loader), PREFIX/lib/
libvllm-python.so.<major> (the runtime library), PREFIX/lib/libvllm.cfg,
PREFIX/lib/libvllm/python/libvllm/{capi,engine,kernels} (the Python side, sources only),
PREFIX/lib/pkgconfig/libvllm.pc, PREFIX/include/vllm.h, PREFIX/bin/vllm-cli. The
library finds the Python side relative to itself (libvllm.cfg: pythonpath
libvllm/python). The python it starts: LIBVLLM_PYTHON when set, else the cfg's python
(the environment that ran this script, or --python; relative when inside PREFIX), else
PREFIX/bin/python3.X (a prefix that is itself such an environment). Copying or moving
the prefix keeps it working; the source tree is not used any more.

wheel_payload(capi_dir): what `pip install .` adds to the capi package (setup.py):
libvllm/capi/lib/libvllm.so.<major> (+ libvllm.so), libvllm/capi/lib/libvllm-python.so.<major>,
capi/lib/pkgconfig/libvllm.pc and capi/include/vllm.h; no libvllm.cfg: the loader finds
ENV/bin/python3.X above ENV/lib/python3.X/site-packages/libvllm/capi/lib and the packages in
site-packages. `python -m libvllm.capi --pkg-config-path` prints where.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from libvllm.capi.build import (  # noqa: E402
    BUILD,
    ROOT,
    RUNTIME,
    SONAME,
    compile_library,
    link_soname,
    relative_or_absolute,
    write_pkg_config,
    write_runtime_cfg,
)

PACKAGES = ("capi", "engine", "kernels")  # under libvllm/ (libvllm/__init__.py)


def environment_python() -> Path:
    """This environment's python under the environment's real folder (a symlinked
    .venv resolved), not the interpreter binary itself (a venv's python finds its venv)."""
    return Path(sys.prefix).resolve() / "bin" / Path(sys.executable).name


def copy_python_side(dest: Path) -> None:
    """The libvllm package under dest: libvllm/__init__.py and the .py files of
    PACKAGES in dest/libvllm (no caches, no C sources)."""
    (dest / "libvllm").mkdir(parents=True, exist_ok=True)
    shutil.copy2(ROOT / "libvllm" / "__init__.py", dest / "libvllm" / "__init__.py")
    for package in PACKAGES:
        for source in sorted((ROOT / package).rglob("*.py")):
            if "__pycache__" in source.parts:
                continue
            target = dest / "libvllm" / source.relative_to(ROOT)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def _install_file(source: Path, target: Path, mode: int) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    shutil.copyfile(source, tmp)
    os.chmod(tmp, mode)
    os.replace(tmp, target)


def install_prefix(prefix: Path, destdir: str = "", python: Path | None = None) -> None:
    root = Path(destdir + str(prefix)) if destdir else prefix
    lib = root / "lib"
    for name in (SONAME, RUNTIME):
        _install_file(BUILD / name, lib / name, 0o755)
    link_soname(lib)
    python_side = lib / "libvllm" / "python"
    shutil.rmtree(python_side, ignore_errors=True)  # no stale modules of an older version
    copy_python_side(python_side)
    python = python or environment_python()
    write_runtime_cfg(lib, relative_or_absolute(python, prefix / "lib", prefix),
                      "libvllm/python")
    write_pkg_config(lib / "pkgconfig" / "libvllm.pc", "${pcfiledir}/../..", "${pcfiledir}/..",
                     "${pcfiledir}/../../include")
    _install_file(ROOT / "include" / "vllm.h", root / "include" / "vllm.h", 0o644)
    _install_file(BUILD / "vllm-cli", root / "bin" / "vllm-cli", 0o755)


def wheel_payload(capi_dir: Path) -> None:
    """The libraries, header and pkg-config file inside the built capi package."""
    lib = capi_dir / "lib"
    with tempfile.TemporaryDirectory() as work:
        compile_library(Path(work), lib)
    shutil.copyfile(lib / SONAME, lib / "libvllm.so")  # wheels hold no symlinks
    write_pkg_config(lib / "pkgconfig" / "libvllm.pc", "${pcfiledir}/../..", "${pcfiledir}/..",
                     "${pcfiledir}/../../include")
    (capi_dir / "include").mkdir(exist_ok=True)
    shutil.copyfile(ROOT / "include" / "vllm.h", capi_dir / "include" / "vllm.h")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefix", required=True, type=Path)
    parser.add_argument("--destdir", default="", help="staging root (packagers' DESTDIR)")
    parser.add_argument("--python", type=Path, help="the python to start (default: this one's "
                        "environment)")
    args = parser.parse_args()
    if not args.prefix.is_absolute():
        parser.error(f"--prefix must be an absolute path, got {args.prefix}")
    install_prefix(args.prefix, args.destdir, args.python)
    print(f"installed libvllm into {args.destdir}{args.prefix}")


if __name__ == "__main__":
    main()
