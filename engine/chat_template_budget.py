"""The work budget of one chat-template render and the checks that enforce it up front.

engine/chat_template.py renders untrusted templates in a sandbox; this module owns what a
render may cost: wall time (Budget.tick on every loop iteration, call, filter, operator
and output chunk), the size of the output and of any one value, and the characters all
operations produce together (Budget.charge). `*`, `**`, `+`, `%`, the str methods and
filters that grow their input (width / fill arguments, replace, join, format strings,
indent, wordwrap, batch, slice, tojson indent) are refused before they run when their
result would not fit. The budget in force is a ContextVar (BUDGET), out of the template's
reach. Every refusal raises BudgetExceeded.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Mapping
from contextvars import ContextVar

MAX_OUTPUT_CHARS = 1 << 20  # rendered prompt, and any single value a template builds
MAX_RENDER_SECONDS = 2.0
MAX_WORK_CHARS = 64 * MAX_OUTPUT_CHARS  # characters all template operations produce together
_MAX_INT_BITS = 1 << 16
_MAX_JSON_INDENT = 16


class BudgetExceeded(Exception):
    """A render went over its budget; the message says which part."""


class Budget:
    """Time and work left to one render; reached through a ContextVar, not the template."""

    def __init__(self) -> None:
        self.deadline = time.monotonic() + MAX_RENDER_SECONDS
        self.work_left = MAX_WORK_CHARS

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise BudgetExceeded(f"rendering took longer than {MAX_RENDER_SECONDS} s")

    def charge(self, value: object) -> object:
        """Count what an operation produced; returns it."""
        self.tick()
        size = len(value) if isinstance(value, (str, list, tuple, dict)) else 0
        need(size)
        self.work_left -= size
        if self.work_left < 0:
            raise BudgetExceeded(f"template operations produced over {MAX_WORK_CHARS} characters")
        return value


BUDGET: ContextVar[Budget] = ContextVar("chat_template_budget")


def need(chars: int) -> None:
    if chars > MAX_OUTPUT_CHARS:
        raise BudgetExceeded(f"a value of {chars} characters exceeds {MAX_OUTPUT_CHARS}")


def weight(value: object) -> int:
    """Characters `value` prints as, roughly, counting containers deep; stops past the cap."""
    total, stack = 0, [value]
    while stack and total <= MAX_OUTPUT_CHARS:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, dict):
            total += len(item)
            stack.extend(item.items())
        elif isinstance(item, (list, tuple)):
            total += len(item)
            stack.extend(item)
        else:
            total += 1
    return total


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_PRINTF_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d*)(?:\.(\*|\d*))?")
_BRACE_SPEC = re.compile(r"\{[^{}]*:([^{}]*)\}")
_NESTED_BRACE = re.compile(r"\{[^{}]*\{")


def _check_format(fmt: str, values: object) -> None:
    """Refuse widths/precisions over the cap, literal or passed as arguments."""
    specs = [g for m in _PRINTF_SPEC.finditer(fmt) for g in m.groups() if g]
    specs += _BRACE_SPEC.findall(fmt)
    numbers = [int(n) for spec in specs for n in re.findall(r"\d+", spec)]
    if any(n > MAX_OUTPUT_CHARS for n in numbers):
        raise BudgetExceeded("a format width or precision exceeds the output budget")
    dynamic = "*" in specs or _NESTED_BRACE.search(fmt)
    if isinstance(values, Mapping):
        values = list(values.values())
    elif not isinstance(values, (list, tuple)):
        values = [values]
    if dynamic and any(_is_int(v) and abs(v) > MAX_OUTPUT_CHARS for v in values):
        raise BudgetExceeded("a format width argument exceeds the output budget")
    need(len(fmt) + weight(values))


def _check_repeat(left: object, right: object) -> None:
    if _is_int(left) and _is_int(right):
        if left.bit_length() + right.bit_length() > _MAX_INT_BITS:
            raise BudgetExceeded("integer product too large")
        return
    seq, count = (right, left) if _is_int(left) else (left, right)
    if isinstance(seq, (str, list, tuple)) and _is_int(count):
        need(weight(seq) * max(count, 0))


def _check_power(base: object, exp: object) -> None:
    if _is_int(base) and _is_int(exp) and abs(base) > 1 and base.bit_length() * exp > _MAX_INT_BITS:
        raise BudgetExceeded("integer power too large")


BINOP_CHECKS = {
    "*": _check_repeat,
    "**": _check_power,
    "+": lambda left, right: need(weight(left) + weight(right)),
    "%": lambda left, right: _check_format(left, right) if isinstance(left, str) else None,
}


def _check_width(s: str, width: object = 0, fillchar: object = " ") -> None:
    need(max(len(s), width if _is_int(width) else 0))


def _check_replace(s: str, old: object, new: object, count: object = -1) -> None:
    if isinstance(old, str) and isinstance(new, str):
        need(len(s) + s.count(old) * len(new))


def check_join(sep: str, items: object) -> None:
    """`items` is a list here: iterators are listed before the check."""
    if isinstance(items, (list, tuple)):
        need(weight(items) + len(sep) * len(items))
    elif isinstance(items, (str, dict)):
        need(len(items) * (len(sep) + 1))


# str method -> check taking (the string, the call's arguments).
STR_METHOD_CHECKS = {
    "center": _check_width,
    "ljust": _check_width,
    "rjust": _check_width,
    "zfill": _check_width,
    "expandtabs": lambda s, tabsize=8: need(len(s) * (tabsize if _is_int(tabsize) else 8)),
    "replace": _check_replace,
    "join": check_join,
    "translate": lambda s, table: need(
        len(s) * max(map(weight, dict(table).values()), default=1)
    ),
    "format": lambda fmt, *args, **kwargs: _check_format(fmt, [*args, *kwargs.values()]),
    "format_map": _check_format,
}


def listed(args: tuple, index: int) -> tuple:
    """`args` with args[index] turned into a list if it is a one-shot iterator."""
    value = args[index]
    if isinstance(value, (str, list, tuple, dict)) or not hasattr(value, "__iter__"):
        return args
    return (*args[:index], list(value), *args[index + 1 :])


def _check_fill(count: object, fill_with: object) -> None:
    if fill_with is not None and _is_int(count):
        need(weight(fill_with) * max(count, 0))


def _check_indent(s: object, width: object = 4, *_: object, **__: object) -> None:
    pad = len(width) if isinstance(width, str) else width if _is_int(width) else 0
    need(len(str(s)) + (str(s).count("\n") + 1) * max(pad, 0))


def _check_json_indent(indent: object) -> None:
    if (len(indent) if isinstance(indent, str) else indent or 0) > _MAX_JSON_INDENT:
        raise BudgetExceeded(f"tojson indent over {_MAX_JSON_INDENT}")


# Filter -> check with the filter's own parameters (pass_eval_context ones get eval_ctx first).
_FILTER_CHECKS = {
    "center": lambda value, width=80: _check_width(str(value), width),
    "indent": _check_indent,
    "replace": lambda eval_ctx, s, old, new, count=None: _check_replace(str(s), old, new),
    "join": lambda eval_ctx, value, d="", attribute=None: check_join(str(d), value),
    "format": lambda value, *args, **kwargs: _check_format(str(value), kwargs or args),
    # Bound as if every character started a line.
    "wordwrap": lambda env, s, width=79, long=True, wrapstring=None, *_, **__: need(
        len(str(s)) * (1 + len(str(wrapstring or "\n")))
    ),
    "batch": lambda value, linecount, fill_with=None: _check_fill(linecount, fill_with),
    "slice": lambda value, slices, fill_with=None: _check_fill(slices, fill_with),
    "tojson": lambda value, ascii=False, indent=None, *_, **__: _check_json_indent(indent),
}


def guard_filter(name: str, func):
    """The filter, with its budget check before and the result charged after."""
    check = _FILTER_CHECKS.get(name)

    @functools.wraps(func)  # keeps jinja's pass_context/pass_eval_context marker
    def guarded(*args, **kwargs):
        budget = BUDGET.get()
        budget.tick()
        if name == "join":
            args = listed(args, 1)
        if check is not None:
            check(*args, **kwargs)
        return budget.charge(func(*args, **kwargs))

    return guarded
