"""Builds build/libvllm.so (SONAME libvllm.so.<major>, the loader) and
build/libvllm-python.so.<major> (the runtime library, cffi's embedding mode).

Run with the python of the environment that holds the engine's packages:
    .venv/bin/python capi/build.py
Neither library links libpython or records a path (no RUNPATH): the loader
(capi/loader.c) finds a python at run time (LIBVLLM_PYTHON, libvllm.cfg beside it, the
environment it is installed into), loads that python's libpython RTLD_GLOBAL, then the
runtime library beside itself. build/libvllm.cfg names this python (relative when inside
the tree) and pythonpath `..` (this source tree), so only C and header changes need a
rebuild. The same binaries are installed by capi/install.py. build/libvllm.pc lets
pkg-config find them.

Layout of the runtime library's generated C file (cffi): cffi's support code, then
C_SOURCES (every vllm.h function), then the cffi-generated bodies of the glue_*
functions of capi/glue.h, which call into capi/glue.py and the modules it imports. The
loader is capi/pure.c, capi/loader.c and the forwarders of capi/forwarders.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from libvllm.capi.forwarders import forwarders_source  # noqa: E402
from libvllm.capi.header import GLUE_HEADER, ROOT, abi_version, api_cdef, cdef_source, region  # noqa: E402

BUILD = ROOT / "build"
MODULE = "_libvllm"
C_SOURCES = ["pure.c", "libvllm.c", "shims.c", "stream_shims.c"]  # one unit, in order
LOADER_SOURCES = ["pure.c", "loader.c"]  # then the generated forwarders
SONAME = f"libvllm.so.{abi_version()[0]}"
RUNTIME = f"libvllm-python.so.{abi_version()[0]}"
PY_VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"

# Runs inside the embedded interpreter on the first Python-backed call. Failures
# are recorded for vllm_last_error(), never printed.
INIT_CODE = """
import os
import sys

from _libvllm import ffi, lib


def _start():
    source_dir = "(unknown)"
    try:  # nothing may escape: cffi would print it, a SystemExit would end the host
        source_dir = ffi.string(lib.glue_python_path()).decode("utf-8", "surrogateescape")
        if "torch" not in sys.modules:  # its OpenMP threads then sleep between calls, not spin
            os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        if not source_dir:  # the package is installed in this environment
            source_dir = f"the sys.path of {sys.executable}"
        elif source_dir not in sys.path:
            sys.path.insert(0, source_dir)
        import libvllm.capi.glue  # noqa: F401  (registers the glue_* functions)
    except BaseException as e:
        message = (f"cannot load libvllm's Python side from {source_dir}: {type(e).__name__}: "
                   f"{e} (python: {sys.executable}; LIBVLLM_PYTHON names the python of an "
                   "environment that has torch and the libvllm package)")
        lib.glue_set_start_error(message.encode("utf-8", "replace"))


_start()
"""


def c_string(text: str) -> str:
    """A C string literal for text (UTF-8, non-printable bytes escaped)."""
    out = []
    for byte in text.encode("utf-8"):
        char = chr(byte)
        out.append(f"\\{byte:03o}" if not 32 <= byte < 127 or char in '"\\?' else char)
    return '"' + "".join(out) + '"'


def project_version() -> str:
    """The one version of libvllm: engine.__version__ (pyproject reads it too)."""
    text = (ROOT / "engine" / "__init__.py").read_text(encoding="utf-8")
    return re.search(r'^__version__\s*=\s*"([^"]+)"', text, re.M).group(1)


def make_ffi():
    import cffi

    ffi = cffi.FFI()
    ffi.cdef(api_cdef())
    python_side = cdef_source(region(GLUE_HEADER, "GLUE_PYTHON"))
    ffi.cdef('extern "Python+C" {\n' + python_side + "\n}")
    ffi.cdef(cdef_source(region(GLUE_HEADER, "GLUE_C")))
    ffi.embedding_init_code(INIT_CODE)
    preamble = f"#define VLLM_LIB_VERSION {c_string(project_version())}\n" + "\n".join(
        (ROOT / "capi" / name).read_text(encoding="utf-8") for name in C_SOURCES)
    ffi.set_source(MODULE, preamble)
    return ffi


def _compile(sources: list[Path], output: Path, *extra: str) -> None:
    flags = "-shared -fPIC -O2 -g -pthread -fvisibility=hidden -Wall -Wextra -Wno-unused-parameter"
    python_include = sysconfig.get_paths()["include"]
    includes = [ROOT / "include", ROOT / "capi", python_include]
    # the debug information names no folder of this machine (the sources are libvllm/...)
    prefix_maps = {os.getcwd(): ".", python_include: "python", str(ROOT): "libvllm",
                   str(sources[0].parent): "libvllm/build"}
    tmp = output.with_name(output.name + ".tmp")
    subprocess.run([os.environ.get("CC", "cc"), *flags.split(),
                    *(f"-ffile-prefix-map={k}={v}" for k, v in prefix_maps.items()),
                    *(f"-I{path}" for path in includes), *map(str, sources), "-o", str(tmp),
                    *extra], check=True)
    os.replace(tmp, output)  # a running program keeps its old copy


def loader_c_source() -> str:
    """The loader's one C file (capi/loader.c's header comment)."""
    defines = {"VLLM_LIB_VERSION": project_version(), "LIBVLLM_PY_VERSION": PY_VERSION,
               "LIBVLLM_RUNTIME": RUNTIME}
    return "#define _GNU_SOURCE\n" + "".join(
        f"#define {k} {c_string(v)}\n" for k, v in defines.items()) + "".join(
        (ROOT / "capi" / name).read_text(encoding="utf-8") for name in LOADER_SOURCES
    ) + forwarders_source()


def compile_library(work_dir: Path, lib_dir: Path) -> None:
    """lib_dir/SONAME (the loader) and lib_dir/RUNTIME (the runtime library); the C
    files are generated in work_dir."""
    work_dir.mkdir(parents=True, exist_ok=True)
    lib_dir.mkdir(parents=True, exist_ok=True)
    c_file = work_dir / f"{MODULE}.c"
    make_ffi().emit_c_code(str(c_file))
    # Python's symbols stay undefined: the loader has loaded a libpython RTLD_GLOBAL
    # first. -Bsymbolic: its own vllm_* calls bind to itself, not to the loader's.
    # -z nodelete: never unmapped by dlclose (the embedded runtime keeps pointers into it)
    _compile([c_file], lib_dir / RUNTIME, "-Wl,-Bsymbolic", "-Wl,-z,nodelete")
    loader = work_dir / "libvllm_loader.c"
    loader.write_text(loader_c_source(), encoding="utf-8")
    _compile([loader], lib_dir / SONAME, f"-Wl,-soname,{SONAME}", "-ldl")


def relative_or_absolute(path: Path, base: Path, within: Path) -> str:
    """path relative to base when it lies inside within, else absolute."""
    return os.path.relpath(path, base) if path.is_relative_to(within) else str(path)


def write_runtime_cfg(lib_dir: Path, python: str, pythonpath: str) -> None:
    """lib_dir/libvllm.cfg: where the library beside it finds its Python side."""
    (lib_dir / "libvllm.cfg").write_text(
        "# Where libvllm.so finds its Python side (capi/libvllm.c, locate_runtime).\n"
        "# Relative paths are relative to this file's folder.\n"
        f"python = {python}\npythonpath = {pythonpath}\n", encoding="utf-8")


def write_pkg_config(pc_file: Path, prefix: str, libdir: str, includedir: str) -> None:
    """pc_file from capi/libvllm.pc.in; the paths are relative to ${pcfiledir}."""
    text = (ROOT / "capi" / "libvllm.pc.in").read_text(encoding="utf-8")
    for key, value in (("PREFIX", prefix), ("LIBDIR", libdir), ("INCLUDEDIR", includedir),
                       ("VERSION", project_version())):
        text = text.replace(f"@{key}@", value)
    pc_file.parent.mkdir(parents=True, exist_ok=True)
    pc_file.write_text(text, encoding="utf-8")


def link_soname(lib_dir: Path) -> None:
    """libvllm.so -> libvllm.so.<major>, also over a link to an older major's file."""
    link = lib_dir / "libvllm.so"
    if not (link.is_symlink() and os.readlink(link) == SONAME):
        link.unlink(missing_ok=True)
        link.symlink_to(SONAME)


def main() -> None:
    compile_library(BUILD, BUILD)
    link_soname(BUILD)
    python = Path(os.path.abspath(sys.executable))  # unresolved: a venv's python finds its venv
    write_runtime_cfg(BUILD, relative_or_absolute(python, BUILD, ROOT), "..")
    write_pkg_config(BUILD / "libvllm.pc", "${pcfiledir}/..", "${pcfiledir}",
                     "${pcfiledir}/../include")
    print(f"built {BUILD / 'libvllm.so'} -> {SONAME}")


if __name__ == "__main__":
    main()
