"""python -m libvllm.capi: where the libvllm C library of this Python environment is, for
building C programs against it (pkg-config's answers, without pkg-config).

    python -m libvllm.capi --cflags --libs        # -I... -L... -lvllm -Wl,-rpath,...
    python -m libvllm.capi --pkg-config-path      # a folder for PKG_CONFIG_PATH
    python -m libvllm.capi --version

Layouts (capi/install.py): a pip-installed capi package holds lib/ and include/; a
`make install` prefix holds the package in PREFIX/lib/libvllm/python; a source checkout
has build/ and include/ beside capi/.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def locate() -> tuple[Path, Path, Path]:
    """(the folder of libvllm.so, of vllm.h, of libvllm.pc) of the first layout found:
    a pip-installed capi package, a `make install` prefix (PREFIX/lib/libvllm/python/libvllm/capi),
    a source checkout."""
    root = HERE.parent
    layouts = [(HERE / "lib", HERE / "include", HERE / "lib" / "pkgconfig"),
               (root / "build", root / "include", root / "build")]
    if len(HERE.parents) > 4:  # HERE = PREFIX/lib/libvllm/python/libvllm/capi
        prefix = HERE.parents[4]
        layouts.insert(1, (prefix / "lib", prefix / "include", prefix / "lib" / "pkgconfig"))
    for lib, include, pc in layouts:
        if (lib / "libvllm.so").exists() and (include / "vllm.h").is_file() and (
                pc / "libvllm.pc").is_file():
            return lib, include, pc
    raise SystemExit(f"libvllm is not built or installed next to {HERE} "
                     "(pip install . / make install / make build/libvllm.so)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m libvllm.capi",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--cflags", action="store_true", help="compiler flags")
    parser.add_argument("--libs", action="store_true", help="linker flags")
    parser.add_argument("--pkg-config-path", action="store_true",
                        help="the folder that holds libvllm.pc")
    parser.add_argument("--version", action="store_true", help="the library's version")
    args = parser.parse_args(argv)
    if not any(vars(args).values()):
        parser.error("give --cflags, --libs, --pkg-config-path or --version")
    if args.version:
        from libvllm import engine

        print(engine.__version__)
        return
    lib, include, pc = locate()
    if args.pkg_config_path:
        print(pc)
        return
    flags = []
    if args.cflags:
        flags.append(f"-I{include}")
    if args.libs:
        flags += [f"-L{lib}", "-lvllm", f"-Wl,-rpath,{lib}"]
    print(" ".join(flags))


if __name__ == "__main__":
    main(sys.argv[1:])
