"""The ABI description of include/vllm.h and the compatibility rule between versions.

    .venv/bin/python capi/abi.py            # print the current description
    .venv/bin/python capi/abi.py --write    # (re)write abi/vllm-<major>.<minor>.json

A description lists every exported function with its prototype (parameter types only),
every typedef, every enum constant, and every struct with its size,
alignment and fields (type, offset, size) on this platform (x86-64 / aarch64 Linux, LP64).
Prototypes come from pycparser, layouts from cffi (the C compiler's rules for these
types; tests/test_abi_guard.py checks them against offsetof/sizeof compiled by cc).

A new major (N.0) is a deliberate break: tests/test_abi_guard.py then requires the
description of the previous major's last minor and a migration note in docs/c_api.md
("## Migrating from <old> to N.0") naming everything broken_names(old, new) lists.

incompatibilities(old, new) is the rule tests/test_abi_guard.py applies between the
checked-in description of an earlier minor version of the same major and the header:
nothing may be removed or changed; structs may only grow at the end, and only those
whose first field is struct_size (a struct without it, e.g. vllm_request_output that is
returned in arrays, must keep its size).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import cffi
from pycparser import c_ast, c_generator, c_parser

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from libvllm.capi.header import HEADER, ROOT, abi_version, api_cdef  # noqa: E402

ABI_DIR = ROOT / "abi"
_PRELUDE = """
typedef signed char int8_t; typedef short int16_t; typedef int int32_t; typedef long int64_t;
typedef unsigned char uint8_t; typedef unsigned short uint16_t; typedef unsigned int uint32_t;
typedef unsigned long uint64_t; typedef unsigned long size_t;
"""
_PRELUDE_NAMES = frozenset(re.findall(r"(\w+);", _PRELUDE))


def _type_text(node: c_ast.Node) -> str:
    """A declaration's type without its names, as C source ("const char *")."""
    node = _strip_names(node)
    return " ".join(c_generator.CGenerator().visit(node).split())


def _strip_names(node: c_ast.Node) -> c_ast.Node:
    if isinstance(node, c_ast.Decl):
        return _strip_names(node.type)
    if isinstance(node, c_ast.Typename):
        return c_ast.Typename(None, node.quals, node.align, _strip_names(node.type))
    if isinstance(node, c_ast.TypeDecl):
        return c_ast.TypeDecl(None, node.quals, node.align, node.type)
    if isinstance(node, c_ast.PtrDecl):
        return c_ast.PtrDecl(node.quals, _strip_names(node.type))
    if isinstance(node, c_ast.FuncDecl):
        params = None if node.args is None else c_ast.ParamList(
            [_strip_names(p) for p in node.args.params])
        return c_ast.FuncDecl(params, _strip_names(node.type))
    return node


def _parse(cdef: str) -> c_ast.FileAST:
    """The declarations as pycparser's AST (which knows no comments)."""
    code = re.sub(r"//[^\n]*", " ", re.sub(r"/\*.*?\*/", " ", cdef, flags=re.S))
    return c_parser.CParser().parse(_PRELUDE + code)


def _declarations(cdef: str) -> tuple[dict, dict]:
    """(function name -> prototype, typedef name -> the type it names)."""
    functions, typedefs = {}, {}
    for node in _parse(cdef).ext:
        if isinstance(node, c_ast.Decl) and isinstance(node.type, c_ast.FuncDecl):
            functions[node.name] = _type_text(node)
        elif isinstance(node, c_ast.Typedef) and node.name not in _PRELUDE_NAMES:
            inner = getattr(node.type, "type", None)
            if isinstance(inner, (c_ast.Struct, c_ast.Enum)):  # the layout is listed apart
                kind = "struct" if isinstance(inner, c_ast.Struct) else "enum"
                typedefs[node.name] = f"{kind} {inner.name}"
            else:
                typedefs[node.name] = _type_text(node.type)
    return functions, typedefs


def _layouts(ffi: cffi.FFI, cdef: str) -> tuple[dict, dict]:
    """(struct name -> layout, enum constant -> value) of the declarations."""
    ast = _parse(cdef)
    structs, enums = {}, {}
    for node in ast.ext:
        kind = getattr(node, "type", None)
        if isinstance(node, c_ast.Typedef) and isinstance(kind, c_ast.TypeDecl):
            kind = kind.type
        if isinstance(kind, c_ast.Struct) and kind.decls is not None:
            ctype = ffi.typeof(f"struct {kind.name}")
            structs[kind.name] = {
                "size": ffi.sizeof(ctype),
                "align": ffi.alignof(ctype),
                "fields": [[name, _type_text(decl), field.offset, ffi.sizeof(field.type)]
                           for (name, field), decl in zip(ctype.fields, kind.decls)],
            }
        elif isinstance(kind, c_ast.Enum) and kind.values is not None:
            ctype = ffi.typeof(f"enum {kind.name}")
            enums.update({name: value for value, name in ctype.elements.items()})
    return structs, dict(sorted(enums.items(), key=lambda kv: (kv[1], kv[0])))


def describe(header: Path = HEADER) -> dict:
    cdef = api_cdef(header)
    ffi = cffi.FFI()
    ffi.cdef(cdef)
    functions, typedefs = _declarations(cdef)
    structs, enums = _layouts(ffi, cdef)
    return {"abi_version": list(abi_version(header)), "functions": functions,
            "typedefs": typedefs, "structs": structs, "enums": enums}


def incompatibilities(old: dict, new: dict) -> list[str]:
    """What in `new` breaks a program built against `old` (same major assumed)."""
    problems = []
    for group in ("functions", "typedefs", "enums"):
        for name, value in old[group].items():
            if name not in new[group]:
                problems.append(f"{group[:-1]} {name} was removed")
            elif new[group][name] != value:
                problems.append(f"{group[:-1]} {name} changed: {value!r} -> {new[group][name]!r}")
    for name, layout in old["structs"].items():
        now = new["structs"].get(name)
        if now is None:
            problems.append(f"struct {name} was removed")
            continue
        if now["fields"][: len(layout["fields"])] != layout["fields"]:
            problems.append(f"struct {name}: existing fields changed")
        grows = layout["fields"] and layout["fields"][0][0] == "struct_size"
        if now["size"] < layout["size"] or (now["size"] != layout["size"] and not grows):
            problems.append(f"struct {name}: size {layout['size']} -> {now['size']}"
                            + ("" if grows else " (no struct_size: its size is frozen)"))
        if now["align"] != layout["align"]:
            problems.append(f"struct {name}: alignment {layout['align']} -> {now['align']}")
    return problems


def description_path(version: tuple[int, int]) -> Path:
    return ABI_DIR / f"vllm-{version[0]}.{version[1]}.json"


def last_of_major(major: int) -> Path | None:
    """The checked-in description of the newest minor of `major`, None if there is none."""
    paths = sorted(ABI_DIR.glob(f"vllm-{major}.*.json"), key=lambda p: int(p.stem.split(".")[1]))
    return paths[-1] if paths else None


def broken_names(old: dict, new: dict) -> set[str]:
    """The functions, typedefs, enum constants and structs a major bump changed or removed:
    each needs a line in the migration note (docs/c_api.md)."""
    return {problem.split()[1].rstrip(":") for problem in incompatibilities(old, new)}


def dumps(description: dict) -> str:
    """JSON with one line per struct field."""
    text = json.dumps(description, indent=1)
    return re.sub(r"\[\s+([^][{}]*?)\s+\]",
                  lambda m: "[" + " ".join(m.group(1).split()) + "]", text) + "\n"


def main(argv: list[str]) -> None:
    description = describe()
    if argv[1:] == ["--write"]:
        path = description_path(tuple(description["abi_version"]))
        ABI_DIR.mkdir(exist_ok=True)
        path.write_text(dumps(description), encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)}")
    else:
        sys.stdout.write(dumps(description))


if __name__ == "__main__":
    main(sys.argv)
