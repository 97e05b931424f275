"""Reads marked regions of C headers for cffi (capi/build.py) and for the tests.

include/vllm.h: the declarations between `/* VLLM_API_BEGIN */` and
`/* VLLM_API_END */` are the ABI. capi/glue.h marks the Python-backed functions
(GLUE_PYTHON) and the C helpers Python calls (GLUE_C) the same way. cffi's parser
knows no preprocessor, so `#` lines and the VLLM_API attribute macro are dropped.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEADER = ROOT / "include" / "vllm.h"
GLUE_HEADER = ROOT / "capi" / "glue.h"
_FUNCTION = re.compile(r"\bVLLM_API\b[^;{]*?\b(vllm_\w+)\s*\(")


def region(path: Path, name: str) -> str:
    """The raw text between `/* NAME_BEGIN */` and `/* NAME_END */` in path."""
    text = path.read_text(encoding="utf-8")
    begin, end = f"/* {name}_BEGIN */", f"/* {name}_END */"
    return text[text.index(begin) + len(begin) : text.index(end)]


def cdef_source(c_text: str) -> str:
    """c_text as cffi cdef source: no preprocessor lines, no VLLM_API."""
    lines = [ln for ln in c_text.splitlines() if not ln.lstrip().startswith("#")]
    return re.sub(r"\bVLLM_API\b\s*", "", "\n".join(lines))


def api_cdef(header: Path = HEADER) -> str:
    """The ABI of include/vllm.h as cffi cdef source."""
    return cdef_source(region(header, "VLLM_API"))


def abi_version(header: Path = HEADER) -> tuple[int, int]:
    """(VLLM_ABI_VERSION_MAJOR, VLLM_ABI_VERSION_MINOR) of the header."""
    text = header.read_text(encoding="utf-8")

    def macro(part: str) -> int:
        return int(re.search(rf"#define VLLM_ABI_VERSION_{part} (\d+)", text).group(1))

    return macro("MAJOR"), macro("MINOR")


def api_functions(header: Path = HEADER) -> list[str]:
    """Names of the functions declared in the ABI region, in header order."""
    return _FUNCTION.findall(region(header, "VLLM_API"))
