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
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        names = [n.removeprefix("libvllm.") for n in names]  # one namespace, same rule
        if any(n == "engine" or n.startswith("engine.") for n in names):
            hits.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return hits


@pytest.mark.parametrize("path", KERNEL_FILES, ids=lambda p: p.name)
def test_kernel_module_imports_no_engine(path: Path):
    hits = _engine_imports(path)
    assert not hits, "kernels/ must not import engine/:\n" + "\n".join(hits)


def test_scan_sees_lazy_imports(tmp_path: Path):
    src = tmp_path / "k.py"
    src.write_text("import torch\nimport libvllm.engine\n\n\ndef f():\n"
                   "    from libvllm.engine.errors import X\n    from libvllm.kernels import "
                   "engine_like\n    from libvllm import engine\n    import engine.x\n")
    assert [h.split(": ")[0].rsplit(":", 1)[1] for h in _engine_imports(src, tmp_path)] == \
        ["2", "6", "8", "9"]


def test_importing_kernels_leaves_engine_unloaded():
    modules = [f"libvllm.kernels.{p.stem}" for p in KERNEL_FILES]
    code = ("import importlib, sys\n"
            f"for m in {modules!r}:\n"
            "    importlib.import_module(m)\n"
            "    if {'engine', 'libvllm.engine'} & set(sys.modules):\n"
            "        sys.exit(f'{m} imports engine')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


# ---- engine/ package seams (vLLM v1: core = scheduler + KV cache, engine_core above
# worker/ and executor/) and import cycles, module-level or lazy ----

PACKAGES = ("engine", "capi", "kernels")
ENGINE_CORE_FORBIDDEN = ("engine.worker", "engine.executor", "engine.models",
                         "engine.model_loader", "engine.engine_core")


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(name: str, modules: set[str]) -> str | None:
    """The longest prefix of dotted name that is one of modules (a `from a.b import c`
    names module a.b.c when that file exists, else a.b)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imports(path: Path, modules: set[str], root: Path = ROOT) -> list[tuple[str, int]]:
    """(imported project module, line) for every import in path, at any depth."""
    me = _module_name(path, root)
    pkg = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for t in targets:
            hit = _resolve(t.removeprefix("libvllm."), modules)  # module names: engine.x
            if hit and hit != me and hit.split(".")[0] in PACKAGES:
                found.append((hit, node.lineno))
                break
    return found


def _is_face(path: Path) -> bool:
    """An __init__.py holding only a docstring, imports and __all__ (a re-export face)."""
    body = ast.parse(path.read_text()).body
    return path.name == "__init__.py" and all(
        isinstance(n, (ast.Import, ast.ImportFrom))
        or (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))
        or (isinstance(n, ast.Assign) and [getattr(t, "id", "") for t in n.targets] == ["__all__"])
        for n in body)


def _graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module import graph of the project; a face's importers import what it re-exports."""
    files = {_module_name(p, root): p for pkg in PACKAGES for p in (root / pkg).rglob("*.py")
             if ".venv" not in p.parts}
    edges = {m: {t for t, _ in _imports(p, set(files), root)} for m, p in files.items()}
    faces = {m for m, p in files.items() if _is_face(p)}
    for m in edges:
        seen, todo = set(), list(edges[m])
        while todo:
            t = todo.pop()
            if t in seen:
                continue
            seen.add(t)
            if t in faces:
                todo.extend(edges[t])
        edges[m] = {t for t in seen if t not in faces and t != m}
    return {m: e for m, e in edges.items() if m not in faces}


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def _subpackage(module: str) -> str | None:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "engine" and len(parts) > 2 else None


def test_no_module_import_cycles():
    assert _cycles(_graph()) == []


def test_no_cycles_between_engine_subpackages():
    pkg_edges: dict[str, set[str]] = {}
    for m, targets in _graph().items():
        a = _subpackage(m)
        for t in targets:
            b = _subpackage(t)
            if a and b and a != b:
                pkg_edges.setdefault(a, set()).add(b)
    assert _cycles(pkg_edges) == []


def _violations(prefix: str, forbidden: tuple[str, ...]) -> list[str]:
    files = {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    hits = []
    for m, p in files.items():
        if m == prefix or m.startswith(prefix + "."):
            for t, line in _imports(p, set(files)):
                if any(t == f or t.startswith(f + ".") for f in forbidden):
                    hits.append(f"{p.relative_to(ROOT)}:{line}: imports {t}")
    return hits


def test_engine_core_is_scheduler_and_kv_cache_only():
    assert _violations("engine.core", ENGINE_CORE_FORBIDDEN) == []


def test_config_imports_no_worker():
    assert _violations("engine.config", ("engine.worker",)) == []


def test_graph_tools_find_cycles_lazy_and_relative(tmp_path: Path):
    for pkg in PACKAGES:
        (tmp_path / pkg).mkdir()
    (tmp_path / "engine" / "a").mkdir()
    (tmp_path / "engine" / "b").mkdir()
    (tmp_path / "engine" / "__init__.py").write_text("")
    (tmp_path / "engine" / "a" / "__init__.py").write_text('"""face"""\nfrom .x import X\n')
    (tmp_path / "engine" / "a" / "x.py").write_text(
        "X = 1\n\ndef f():\n    import libvllm.engine.b.y\n")
    (tmp_path / "engine" / "b" / "__init__.py").write_text("")
    (tmp_path / "engine" / "b" / "y.py").write_text("from libvllm.engine.a import X\n")
    edges = _graph(tmp_path)
    assert edges["engine.b.y"] == {"engine.a.x"}
    assert _cycles(edges) == [["engine.a.x", "engine.b.y"]]


# ---- capi/ is C <-> Python marshalling and error mapping: it reaches the engine only
# through the session face and the OpenAI entry point vllm_openai_request calls ----

CAPI_ALLOWED = ("engine",  # the package root: the version only
                "engine.session",  # EngineSession, its types and errors (the face)
                "engine.entrypoints.openai.api")  # handle_openai_request


def _capi_violations(root: Path = ROOT) -> list[str]:
    files = {_module_name(p, root): p for pkg in PACKAGES for p in (root / pkg).rglob("*.py")
             if ".venv" not in p.parts}
    hits = []
    for path in sorted((root / "capi").glob("*.py")):
        for target, line in _imports(path, set(files), root):
            if target.split(".")[0] == "engine" and target not in CAPI_ALLOWED:
                hits.append(f"{path.relative_to(root)}:{line}: imports {target}")
    return hits


def test_capi_imports_only_the_session_and_openai_entry_point():
    assert _capi_violations() == []


def test_capi_rule_sees_lazy_and_submodule_imports(tmp_path: Path):
    for pkg in PACKAGES:
        (tmp_path / pkg).mkdir()
    (tmp_path / "engine" / "__init__.py").write_text("__version__ = '0'\n")
    (tmp_path / "engine" / "session").mkdir()
    (tmp_path / "engine" / "session" / "__init__.py").write_text("from .s import S\n")
    (tmp_path / "engine" / "session" / "s.py").write_text("S = 1\n")
    (tmp_path / "engine" / "llm_engine.py").write_text("X = 1\n")
    (tmp_path / "capi" / "g.py").write_text(
        "import libvllm.engine\nfrom libvllm.engine.session import S\n\n\ndef f():\n"
        "    from libvllm.engine.llm_engine import X\n    from libvllm.engine.session import s\n")
    assert [h.split(": ", 1)[1] for h in _capi_violations(tmp_path)] == [
        "imports engine.llm_engine", "imports engine.session.s"]
