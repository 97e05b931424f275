"""Layering: kernels/ sits at the bottom and imports nothing from engine/.

Every kernels/*.py is parsed (not imported) and each `import engine...` or
`from engine... import ...` statement, at module level or lazy inside a function, fails
the test with its file:line. Torch references of a kernel live beside it as plain torch or
in the tests (which may import engine/). Also checks that importing each kernel module
leaves engine out of sys.modules (no indirect import through another package).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
KERNEL_FILES = sorted((ROOT / "kernels").glob("*.py"))


def _engine_imports(path: Path, root: Path = ROOT) -> list[str]:
    """'file:line: statement' for every import of engine (or engine.*) in path."""
    hits = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        if any(n == "engine" or n.startswith("engine.") for n in names):
            hits.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return hits


@pytest.mark.parametrize("path", KERNEL_FILES, ids=lambda p: p.name)
def test_kernel_module_imports_no_engine(path: Path):
    hits = _engine_imports(path)
    assert not hits, "kernels/ must not import engine/:\n" + "\n".join(hits)


def test_scan_sees_lazy_imports(tmp_path: Path):
    src = tmp_path / "k.py"
    src.write_text("import torch\nimport engine\n\n\ndef f():\n"
                   "    from engine.errors import X\n    from kernels import engine_like\n")
    assert [h.split(": ")[0].rsplit(":", 1)[1] for h in _engine_imports(src, tmp_path)] == \
        ["2", "6"]


def test_importing_kernels_leaves_engine_unloaded():
    modules = [f"kernels.{p.stem}" for p in KERNEL_FILES]
    code = ("import importlib, sys\n"
            f"for m in {modules!r}:\n"
            "    importlib.import_module(m)\n"
            "    if 'engine' in sys.modules: sys.exit(f'{m} imports engine')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
