"""pydantic ValidationError -> vLLM's "N validation errors:" text and the offending
parameter, as vllm/entrypoints/serve/exception_handling/handlers/validation.py.
"""

from __future__ import annotations

import re

from pydantic import ValidationError

_MAX_REPORTED_ERRORS = 10
_MAX_ERROR_CHARS = 1000


def format_validation_error(exc: ValidationError) -> tuple[str, str | None]:
    errors = exc.errors(include_url=False)
    param = _clean_loc(errors[0].get("loc", ())) if errors else None
    label = "error" if len(errors) == 1 else "errors"
    lines = [f"{len(errors)} validation {label}:"]
    for err in errors[:_MAX_REPORTED_ERRORS]:
        shown = {k: v for k, v in err.items() if k != "ctx"}
        shown["loc"] = _clean_loc(err.get("loc", ()))
        shown["input"] = _summarize(err.get("input"))
        lines.append(f"  {str(shown)[:_MAX_ERROR_CHARS]}")
    if len(errors) > _MAX_REPORTED_ERRORS:
        lines.append(f"  ...and {len(errors) - _MAX_REPORTED_ERRORS} more {label}")
    return "\n".join(lines), param or None


def _clean_loc(loc: tuple) -> str:
    """The location as a dotted path without pydantic's union-branch markers."""
    return ".".join(str(p) for p in loc if not _internal_loc(str(p)))


def _internal_loc(segment: str) -> bool:
    """pydantic's union-branch / wrapper markers in an error location."""
    return bool(re.search(r"[\[\]{}()]", segment)) or segment in (
        "str", "int", "float", "bool", "list", "dict", "function-after", "function-before")


def _summarize(value: object) -> object:
    if isinstance(value, (list, tuple, dict)):
        return f"<{type(value).__name__} of {len(value)} items>"
    text = value if isinstance(value, str) else repr(value)
    return text[:200] + "...[truncated]" if len(text) > 200 else value
