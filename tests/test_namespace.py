"""One distribution namespace: the packages are libvllm.engine, libvllm.capi and
libvllm.kernels, never top-level engine / capi / kernels (Hugging Face's `kernels`
package has that name), and each module is imported under one name only.

Checks: no import statement of the tree names a top-level engine / capi / kernels; the
checkout's libvllm/ links are the package folders; importing the packages in a child
python (repository root on sys.path, as pytest and the examples run) loads every module
from this checkout under libvllm.* and nothing under the bare names.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("engine", "capi", "kernels")
SCANNED = (*PACKAGES, "examples", "tests")


def _bare_imports(path: Path, root: Path = ROOT) -> list[str]:
    hits = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        if any(n.split(".")[0] in PACKAGES for n in names):
            hits.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return hits


@pytest.mark.parametrize("folder", SCANNED)
def test_no_import_names_a_bare_package(folder):
    hits = [h for p in sorted((ROOT / folder).rglob("*.py")) for h in _bare_imports(p)]
    assert not hits, "import through libvllm.<package>:\n" + "\n".join(hits)


def test_bare_import_scan_sees_them(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("import engine\nfrom libvllm.engine import x\n\n\ndef f():\n"
                   "    from kernels.gemv import g\n")
    assert [h.split(": ")[0].rsplit(":", 1)[1] for h in _bare_imports(src, tmp_path)] \
        == ["1", "6"]


@pytest.mark.parametrize("package", PACKAGES)
def test_checkout_links_are_the_package_folders(package):
    link = ROOT / "libvllm" / package
    assert link.is_symlink() and link.resolve() == (ROOT / package).resolve()


def test_each_module_loads_once_under_libvllm():
    kernels = sorted(f"libvllm.kernels.{p.stem}" for p in (ROOT / "kernels").glob("*.py")
                     if p.stem != "__init__")
    code = ("import importlib, json, sys\n"
            f"for m in {[*kernels, 'libvllm.engine.llm_engine', 'libvllm.capi.header']!r}:\n"
            "    importlib.import_module(m)\n"
            "print(json.dumps({k: getattr(v, '__file__', None) for k, v in sys.modules.items()"
            " if v is not None}))\n")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    import json

    files = json.loads(run.stdout.splitlines()[-1])
    bare = [k for k in files if k.split(".")[0] in PACKAGES]
    assert bare == [], f"modules imported under a bare package name: {bare}"
    ours = {k: f for k, f in files.items() if k.split(".")[0] == "libvllm"}
    assert "libvllm.engine.llm_engine" in ours and "libvllm.kernels" in ours
    elsewhere = {k: f for k, f in ours.items()
                 if f and not Path(f).resolve().is_relative_to(ROOT)}
    assert elsewhere == {}, f"libvllm modules from outside this checkout: {elsewhere}"
