"""Builds build/libvllm.so (SONAME libvllm.so.0) with cffi's embedding mode.

Run with the python of the environment that holds the engine's packages:
    .venv/bin/python capi/build.py
That python's path and this source tree's path are baked into the library, so a
C program needs no environment variable to run it (overrides: LIBVLLM_PYTHON,
LIBVLLM_SOURCE_DIR). The library imports capi/ and engine/ from the source tree
at run time: only C and header changes need a rebuild.

Layout of the generated C file (cffi): cffi's support code, then C_SOURCES (every
vllm.h function), then the cffi-generated bodies of the glue_* functions of
capi/glue.h, which call into capi/glue.py and the modules it imports.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import cffi

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from capi.header import GLUE_HEADER, ROOT, abi_version, api_cdef, cdef_source, region  # noqa: E402

BUILD = ROOT / "build"
MODULE = "_libvllm"
C_SOURCES = ["libvllm.c", "shims.c", "stream_shims.c"]  # one translation unit, in order
SONAME = f"libvllm.so.{abi_version()[0]}"

# Runs inside the embedded interpreter on the first Python-backed call. Failures
# are recorded for vllm_last_error(), never printed.
INIT_CODE = """
import os
import sys

from _libvllm import lib


def _start(source_dir):
    source_dir = os.environ.get("LIBVLLM_SOURCE_DIR") or source_dir
    if source_dir not in sys.path:
        sys.path.insert(0, source_dir)
    try:
        import capi.glue  # noqa: F401  (registers the glue_* functions)
    except BaseException as e:
        message = f"cannot load libvllm's Python side from {source_dir}: {type(e).__name__}: {e}"
        lib.glue_set_start_error(message.encode("utf-8", "replace"))


_start(SOURCE_DIR)
"""


def c_string(text: str) -> str:
    """A C string literal for text (UTF-8, non-printable bytes escaped)."""
    out = []
    for byte in text.encode("utf-8"):
        char = chr(byte)
        out.append(f"\\{byte:03o}" if not 32 <= byte < 127 or char in '"\\?' else char)
    return '"' + "".join(out) + '"'


def project_version() -> str:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    return re.search(r'^version\s*=\s*"([^"]+)"', text, re.M).group(1)


def build_python() -> str:
    """This python, not resolved through symlinks: a venv's python finds its venv."""
    return os.path.abspath(sys.executable)


def make_ffi() -> cffi.FFI:
    ffi = cffi.FFI()
    ffi.cdef(api_cdef())
    python_side = cdef_source(region(GLUE_HEADER, "GLUE_PYTHON"))
    ffi.cdef('extern "Python+C" {\n' + python_side + "\n}")
    ffi.cdef(cdef_source(region(GLUE_HEADER, "GLUE_C")))
    ffi.embedding_init_code(f"SOURCE_DIR = {str(ROOT)!r}\n" + INIT_CODE)
    preamble = (
        f"#define VLLM_LIB_VERSION {c_string(project_version())}\n"
        f"#define VLLM_BUILD_PYTHON {c_string(build_python())}\n"
        + "\n".join((ROOT / "capi" / name).read_text(encoding="utf-8") for name in C_SOURCES)
    )
    ffi.set_source(MODULE, preamble)
    return ffi


def compile_command(c_file: Path, output: Path) -> list[str]:
    cfg = sysconfig.get_config_var
    libdir = cfg("LIBDIR")
    flags = "-shared -fPIC -O2 -g -pthread -fvisibility=hidden -Wall -Wextra -Wno-unused-parameter"
    includes = [ROOT / "include", ROOT / "capi", sysconfig.get_paths()["include"]]
    return [
        os.environ.get("CC", "cc"),
        *flags.split(),
        *(f"-I{path}" for path in includes),
        str(c_file),
        *("-o", str(output)),
        *(f"-L{libdir}", f"-lpython{cfg('LDVERSION')}"),
        *(f"-Wl,-rpath,{libdir}", f"-Wl,-soname,{SONAME}"),
        # never unmapped by dlclose: the embedded runtime keeps pointers into this library
        # (its module stays in sys.modules; a Python host that dlcloses it must not crash)
        "-Wl,-z,nodelete",
    ]


def main() -> None:
    BUILD.mkdir(exist_ok=True)
    c_file = BUILD / f"{MODULE}.c"
    make_ffi().emit_c_code(str(c_file))
    real, tmp, link = BUILD / SONAME, BUILD / f"{SONAME}.tmp", BUILD / "libvllm.so"
    subprocess.run(compile_command(c_file, tmp), check=True)
    os.replace(tmp, real)  # atomic: a running program keeps its old copy
    if not link.is_symlink():
        link.unlink(missing_ok=True)
        link.symlink_to(SONAME)
    print(f"built {link} -> {SONAME}")


if __name__ == "__main__":
    main()
