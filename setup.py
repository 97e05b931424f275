"""setup.py: only the build step pyproject.toml cannot express. `pip install .` (and a
wheel) compile libvllm.so (the loader) and libvllm-python.so.<major> into the libvllm.capi
package with vllm.h and libvllm.pc (capi/install.py, wheel_payload): the environment
that holds torch is the installation, found above libvllm/capi/lib at run time. Neither library
links or bundles libpython. The wheel is tied to this Python minor version and platform.
An editable install (`pip install -e .`, the Makefile's) skips it: a checkout uses build/.
"""

import sys
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = Path(__file__).resolve().parent


class BuildPyWithLibrary(build_py):
    def run(self) -> None:
        super().run()
        if not self.editable_mode:
            sys.path.insert(0, str(ROOT))
            from libvllm.capi.install import wheel_payload

            wheel_payload(Path(self.build_lib) / "libvllm" / "capi")


class BinaryDistribution(Distribution):
    """A platform wheel: it holds a shared library linked to this Python."""

    def has_ext_modules(self) -> bool:
        return True


# One distribution namespace: engine/, capi/, kernels/ install as libvllm.engine,
# libvllm.capi, libvllm.kernels (pyproject.toml's package-dir maps them); libvllm/ holds
# the namespace's __init__.py (its engine, capi, kernels links serve a checkout only).
PACKAGES = ("engine", "capi", "kernels")
packages = ["libvllm"] + [f"libvllm.{p}" for p in find_packages(
    include=[name for p in PACKAGES for name in (p, f"{p}.*")])]

setup(packages=packages, cmdclass={"build_py": BuildPyWithLibrary},
      distclass=BinaryDistribution, options={"build": {"build_base": "build/setuptools"}})
