"""Shared by tests/test_runtime_install.py and tests/test_install_relocatable.py: a copy of
the checkout's build inputs, a new virtual environment that sees this one's packages
through a .pth line, a user's bare environment, and examples/c/chat.c built with only
pkg-config."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUESTION = "What is the capital of France?"
SOURCES = ["Makefile", "pyproject.toml", "setup.py", "libvllm", "capi", "engine", "kernels",
           "include", "examples/c", "examples/cli"]


def bare_env(**extra: str) -> dict[str, str]:
    """What a user's shell might have: no LIBVLLM_*, no PYTHON*, a plain PATH (and extra)."""
    return {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"), **extra}


def copy_sources(dest: Path) -> Path:
    """The checkout's build inputs (SOURCES) copied under dest, without __pycache__."""
    for name in SOURCES:
        source, target = ROOT / name, dest / name
        if source.is_dir():
            shutil.copytree(source, target, symlinks=True,  # libvllm/: the links
                            ignore=shutil.ignore_patterns("__pycache__"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return dest


def layered_venv(venv: Path, pth_name: str) -> Path:
    """The site-packages of a new virtual environment (no pip) at venv whose .pth file
    pth_name adds this environment's packages (torch)."""
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(subprocess.run([str(venv / "bin/python"), "-c", "import sysconfig; print("
                                "sysconfig.get_paths()['purelib'])"], capture_output=True,
                               text=True, check=True).stdout.strip())
    (site / pth_name).write_text(sysconfig.get_paths()["purelib"] + "\n")
    return site


def build_chat(pc_dir: Path, out: Path) -> Path:
    """examples/c/chat.c built at out with the flags `pkg-config --cflags --libs libvllm`
    gives from pc_dir, in a bare environment."""
    env = bare_env(PKG_CONFIG_PATH=str(pc_dir))
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "libvllm"], env=env,
                           capture_output=True, text=True)
    assert flags.returncode == 0, flags.stderr
    cc = subprocess.run(["cc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic",
                         str(ROOT / "examples/c/chat.c"), "-o", str(out),
                         *flags.stdout.split()], capture_output=True, text=True, env=env)
    assert cc.returncode == 0, cc.stderr
    return out
