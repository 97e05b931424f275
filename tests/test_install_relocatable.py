"""A relocatable install: `make install PREFIX=...` from a copy of the checkout and
`pip install` of the wheel give a library that finds its Python side relative to itself
(capi/loader.c; tests/test_runtime_install.py covers LIBVLLM_PYTHON and a deleted venv).
The copy is deleted, the prefix moved, the checkout's packages (and the ones an editable
install points at) hidden in a mount namespace where possible; a C chat program
built with only pkg-config answers "Paris" greedily with no LIBVLLM_* or PYTHON*
variable, and the Python side it ran was the installed one (its .pyc files appear there).

Oracle: the answer of examples/c/chat.c (as `make run`), the installed file layout
(capi/install.py's docstring). Ours (vLLM ships no C library).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from install_checkout import QUESTION, ROOT, bare_env, build_chat, copy_sources, layered_venv

pytestmark = [pytest.mark.capi, pytest.mark.slow]


def _copy_checkout(dest: Path) -> Path:
    """A fresh checkout (its .venv a link to the environment that holds torch)."""
    copy_sources(dest)
    (dest / ".venv").symlink_to(Path(sys.prefix).resolve())
    return dest


def _make(src: Path, *args: str) -> None:
    # -o: never re-run the .venv set-up steps (pip install -e) from the copy
    make = subprocess.run(["make", "-s", "-o", ".venv/.stamp-install", "-o", ".venv/.stamp-test",
                           *args], cwd=src, capture_output=True, text=True)
    assert make.returncode == 0, make.stdout + make.stderr


def _hidden_package_dirs() -> list[Path]:
    """The checkout's packages and those of an editable install of this environment."""
    dirs = [ROOT / p for p in ("capi", "engine", "kernels")]
    found = subprocess.run([sys.executable, "-c",
                            "from libvllm import engine; print(engine.__file__)"],
                           cwd="/", capture_output=True, text=True, env=bare_env())
    if found.returncode == 0:
        editable_root = Path(found.stdout.strip()).resolve().parent.parent
        dirs += [editable_root / p for p in ("capi", "engine", "kernels")]
    return [d for d in dict.fromkeys(dirs) if d.is_dir()]


def _run_hidden(cmd: list[str]) -> subprocess.CompletedProcess:
    """cmd with the checkout's packages hidden (an empty tmpfs over each, in a private
    mount namespace) when unshare is allowed; as is otherwise."""
    if subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode == 0:
        mounts = " && ".join(f"mount -t tmpfs none '{d}'" for d in _hidden_package_dirs())
        cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
               f"{mounts} && exec \"$@\"", "sh", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, env=bare_env(), timeout=600)


def _pyc_files(tree: Path) -> list[Path]:
    return list(tree.rglob("__pycache__/*.pyc"))


@pytest.fixture(scope="module")
def moved_prefix(tmp_path_factory) -> Path:
    if shutil.which("pkg-config") is None:
        pytest.skip("pkg-config is absent")
    work = tmp_path_factory.mktemp("install")
    src = _copy_checkout(work / "src")
    _make(src, "install", f"PREFIX={work / 'prefix'}")
    shutil.rmtree(src)
    moved = work / "moved"
    (work / "prefix").rename(moved)
    return moved


def work_src(moved_prefix: Path) -> Path:
    """The checkout copy the prefix was installed from (deleted since)."""
    return moved_prefix.parent / "src"


def test_installed_files_hold_no_source_path(moved_prefix):
    cfg = (moved_prefix / "lib/libvllm.cfg").read_text()
    assert "pythonpath = libvllm/python" in cfg
    # only the interpreter is absolute: the environment that holds torch (which may live
    # in the checkout, as .venv does after `make run`); never the source tree or its copy
    settings = [line for line in cfg.splitlines() if line and not line.startswith("#")]
    assert not [s for s in settings if str(ROOT) in s and not s.startswith("python =")]
    assert str(work_src(moved_prefix)) not in cfg
    assert "${pcfiledir}" in (moved_prefix / "lib/pkgconfig/libvllm.pc").read_text()
    assert (moved_prefix / "lib/libvllm/python/libvllm/capi/glue.py").is_file()
    assert not _pyc_files(moved_prefix)


def test_moved_prefix_answers_with_only_pkg_config(moved_prefix, model_path, tmp_path):
    exe = build_chat(moved_prefix / "lib/pkgconfig", tmp_path / "chat")
    run = _run_hidden([str(exe), model_path, QUESTION])
    assert run.returncode == 0, run.stderr
    assert "Paris" in run.stdout
    assert _pyc_files(moved_prefix / "lib/libvllm/python/libvllm/engine")  # the installed side ran


def test_python_m_capi_points_at_the_moved_prefix(moved_prefix):
    """`python -m libvllm.capi` run from the installed Python side names the prefix's files."""
    env = {**bare_env(), "PYTHONPATH": str(moved_prefix / "lib/libvllm/python")}
    pc = subprocess.run([sys.executable, "-m", "libvllm.capi", "--pkg-config-path"], cwd="/",
                        capture_output=True, text=True, env=env)
    assert pc.returncode == 0, pc.stderr
    assert Path(pc.stdout.strip()) == moved_prefix / "lib/pkgconfig"


def test_installed_cli_runs_from_the_moved_prefix(moved_prefix, model_path):
    run = _run_hidden([str(moved_prefix / "bin/vllm-cli"), "generate", "-m", model_path,
                       "--prompt", "The capital of France is", "-n", "8", "--temp", "0"])
    assert run.returncode == 0, run.stderr
    assert "Paris" in run.stdout


def test_python_m_capi_points_at_the_checkout_build(built):
    run = subprocess.run([sys.executable, "-m", "libvllm.capi", "--cflags", "--libs"], cwd=ROOT,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [f"-I{ROOT / 'include'}", f"-L{built}", "-lvllm",
                                  f"-Wl,-rpath,{built}"]
    pc = subprocess.run([sys.executable, "-m", "libvllm.capi", "--pkg-config-path"], cwd=ROOT,
                        capture_output=True, text=True)
    assert Path(pc.stdout.strip()) == built and (built / "libvllm.pc").is_file()


def test_wheel_in_a_fresh_environment(tmp_path, model_path):
    """pip wheel, auditwheel repair (a manylinux tag), pip install into a new virtual
    environment (its site-packages layered on this one's for torch by a .pth line);
    `python -m libvllm.capi --pkg-config-path` guides pkg-config."""
    if shutil.which("pkg-config") is None:
        pytest.skip("pkg-config is absent")
    wheel = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                            "--no-build-isolation", "-w", str(tmp_path / "wheels"),
                            str(_copy_checkout(tmp_path / "src"))],
                           capture_output=True, text=True)
    assert wheel.returncode == 0, wheel.stderr
    shutil.rmtree(tmp_path / "src")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    repair = subprocess.run([sys.executable, "-m", "auditwheel", "repair", "-w",
                             str(tmp_path / "manylinux"),
                             *map(str, (tmp_path / "wheels").glob("*.whl"))],
                            capture_output=True, text=True, env=env)  # make wheel's step
    assert repair.returncode == 0, repair.stderr
    (built,) = (tmp_path / "manylinux").glob("*.whl")
    assert "-manylinux_2_" in built.name, built.name
    env_dir = tmp_path / "env"
    python = env_dir / "bin" / "python"
    site = layered_venv(env_dir, "torch-environment.pth")
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                              "-q", "--no-deps", "--no-index",
                              str(built)], capture_output=True, text=True)
    assert install.returncode == 0, install.stderr
    pc_dir = subprocess.run([str(python), "-m", "libvllm.capi", "--pkg-config-path"], cwd="/",
                            capture_output=True, text=True, env=bare_env())
    assert pc_dir.returncode == 0, pc_dir.stderr
    assert Path(pc_dir.stdout.strip()) == site / "libvllm/capi/lib/pkgconfig"
    exe = build_chat(Path(pc_dir.stdout.strip()), tmp_path / "chat")
    run = _run_hidden([str(exe), model_path, QUESTION])
    assert run.returncode == 0, run.stderr
    assert "Paris" in run.stdout
    assert _pyc_files(site / "libvllm/engine")
    assert not [p for p in ("engine", "capi", "kernels") if (site / p).exists()]
