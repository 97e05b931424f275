"""Generates the loader's forwarders (capi/loader.c): one C function per Python-backed
function of include/vllm.h that loads the runtime library on first use and calls its
namesake there, plus bind_forwarders(), which looks every one up in it.

Rules of a forwarder when the runtime library cannot be loaded: a status function
returns VLLM_ERR_INVALID_ARGUMENT when its first (handle) argument is NULL, else
VLLM_ERR_RUNTIME_INIT with the loader's message; a void function (the *_free functions,
vllm_shutdown) does nothing and never loads it. The functions of capi/pure.c and
vllm_log_set / vllm_last_error are the loader's own.
"""

from __future__ import annotations

import re

from libvllm.capi.header import ROOT, api_cdef

# answered by the loader itself (capi/pure.c, capi/loader.c)
LOADER_OWN = {"vllm_log_set", "vllm_last_error"}


def pure_functions() -> set[str]:
    """The vllm_* functions capi/pure.c defines."""
    text = (ROOT / "capi" / "pure.c").read_text(encoding="utf-8")
    return set(re.findall(r"^VLLM_API\b[^;{(]*?\b(vllm_\w+)\s*\(", text, re.M))


def _declarations():
    import cffi

    ffi = cffi.FFI()
    ffi.cdef(api_cdef())
    for key, (tp, _quals) in ffi._parser._declarations.items():
        if key.startswith("function "):
            yield key.split(" ", 1)[1], tp


def _clear_outs(args) -> str:
    """Statements setting the out-parameters (T ** and size_t *, non-const) to NULL / 0, as
    vllm.h promises on every failure, also the runtime's failure to load."""
    lines = []
    for i, a in enumerate(args):
        c = a.get_c_name("")
        if c.endswith("* *"):
            lines.append(f"        if (a{i} != NULL) *a{i} = NULL;\n")
        elif c == "size_t *":
            lines.append(f"        if (a{i} != NULL) *a{i} = 0;\n")
    return "".join(lines)


def forwarders_source() -> str:
    """C source of the forwarders and bind_forwarders()."""
    own = pure_functions() | LOADER_OWN
    pointers, bodies, binds = [], [], []
    for name, tp in _declarations():
        if name == "vllm_last_error":
            binds.append(f'    *(void **)&runtime_last_error = dlsym(handle, "{name}");\n'
                         "    if (runtime_last_error == NULL) return 0;")
        if name in own:
            continue
        params = ", ".join(a.get_c_name(f" a{i}") for i, a in enumerate(tp.args)) or "void"
        args = ", ".join(f"a{i}" for i in range(len(tp.args)))
        pointer = f"fwd_{name}"
        pointers.append(f"static {tp.result.get_c_name(f'(*{pointer})({params})')};")
        signature = tp.result.get_c_name(f" {name}({params})")
        if tp.result.get_c_name("") == "void":
            body = f"    if (!runtime_was_loaded()) return;\n    {pointer}({args});"
        else:
            first_null = "a0 == NULL" if tp.args and tp.args[0].get_c_name("").endswith(
                "*") else "0"
            body = (f"    if (!runtime_ready()) {{\n{_clear_outs(tp.args)}"
                    f"        return not_loaded(__func__, {first_null});\n    }}\n"
                    f"    return {pointer}({args});")
        bodies.append(f"VLLM_API {signature} {{\n{body}\n}}\n")
        binds.append(f'    *(void **)&{pointer} = dlsym(handle, "{name}");\n'
                     f"    if ({pointer} == NULL) return 0;")
    bind = "static int bind_forwarders(void *handle) {\n" + "\n".join(binds) + \
        "\n    return 1;\n}\n"
    return "\n".join(pointers) + "\n\n" + "\n".join(bodies) + "\n" + bind
