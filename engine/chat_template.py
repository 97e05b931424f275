"""Chat templates: render a model's Jinja chat template over a conversation, sandboxed.

Owns compiling (cached) and rendering untrusted templates. Mirrors transformers'
utils/chat_template_utils.py (`_compile_jinja_template`, `render_jinja_template`): an
ImmutableSandboxedEnvironment (trim_blocks, lstrip_blocks, loopcontrols) with
`raise_exception`, `strftime_now`, a non-escaping `tojson`, a `namespace` refusing underscore
names, a plain `dict`, and `{% generation %}` blocks rendering their body. Message content
follows vllm/entrypoints/chat_utils.py for text-only models: None -> "", text parts joined
by newlines.

Each render runs under a work budget: wall time (checked on every loop iteration, call,
filter, operator and output chunk), output size, the size of any one value, and the
characters all operations produce together; `*`, `**`, width/fill arguments, replace, join
and format strings are refused up front when their result would not fit. Every failure
(compile error, sandbox violation, budget, raise_exception) raises ChatTemplateError.
"""

from __future__ import annotations

import functools
import json
import re
import time
from collections.abc import Mapping
from contextvars import ContextVar
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.compiler import CodeGenerator
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from engine.errors import InvalidArgumentError

MAX_OUTPUT_CHARS = 1 << 20  # rendered prompt, and any single value a template builds
MAX_RENDER_SECONDS = 2.0
MAX_WORK_CHARS = 64 * MAX_OUTPUT_CHARS  # characters all template operations produce together
_MAX_INT_BITS = 1 << 16
_MAX_JSON_INDENT = 16
_TEXT_PART_TYPES = ("text", "input_text")


class ChatTemplateError(InvalidArgumentError):
    """The chat template failed to compile or render, or exceeded its work budget."""


class _TemplateRaised(TemplateError):
    """raise_exception() called by the template."""


class _BudgetExceeded(Exception):
    pass


class _Budget:
    """Time and work left to one render; reached through a ContextVar, not the template."""

    def __init__(self) -> None:
        self.deadline = time.monotonic() + MAX_RENDER_SECONDS
        self.work_left = MAX_WORK_CHARS

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise _BudgetExceeded(f"rendering took longer than {MAX_RENDER_SECONDS} s")

    def charge(self, value: object) -> object:
        """Count what an operation produced; returns it."""
        self.tick()
        size = len(value) if isinstance(value, (str, list, tuple, dict)) else 0
        _need(size)
        self.work_left -= size
        if self.work_left < 0:
            raise _BudgetExceeded(f"template operations produced over {MAX_WORK_CHARS} characters")
        return value


_BUDGET: ContextVar[_Budget] = ContextVar("chat_template_budget")


def _need(chars: int) -> None:
    if chars > MAX_OUTPUT_CHARS:
        raise _BudgetExceeded(f"a value of {chars} characters exceeds {MAX_OUTPUT_CHARS}")


def _weight(value: object) -> int:
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
        raise _BudgetExceeded("a format width or precision exceeds the output budget")
    dynamic = "*" in specs or _NESTED_BRACE.search(fmt)
    if isinstance(values, Mapping):
        values = list(values.values())
    elif not isinstance(values, (list, tuple)):
        values = [values]
    if dynamic and any(_is_int(v) and abs(v) > MAX_OUTPUT_CHARS for v in values):
        raise _BudgetExceeded("a format width argument exceeds the output budget")
    _need(len(fmt) + _weight(values))


def _check_repeat(left: object, right: object) -> None:
    if _is_int(left) and _is_int(right):
        if left.bit_length() + right.bit_length() > _MAX_INT_BITS:
            raise _BudgetExceeded("integer product too large")
        return
    seq, count = (right, left) if _is_int(left) else (left, right)
    if isinstance(seq, (str, list, tuple)) and _is_int(count):
        _need(_weight(seq) * max(count, 0))


def _check_power(base: object, exp: object) -> None:
    if _is_int(base) and _is_int(exp) and abs(base) > 1 and base.bit_length() * exp > _MAX_INT_BITS:
        raise _BudgetExceeded("integer power too large")


_BINOP_CHECKS = {
    "*": _check_repeat,
    "**": _check_power,
    "+": lambda left, right: _need(_weight(left) + _weight(right)),
    "%": lambda left, right: _check_format(left, right) if isinstance(left, str) else None,
}


def _check_width(s: str, width: object = 0, fillchar: object = " ") -> None:
    _need(max(len(s), width if _is_int(width) else 0))


def _check_replace(s: str, old: object, new: object, count: object = -1) -> None:
    if isinstance(old, str) and isinstance(new, str):
        _need(len(s) + s.count(old) * len(new))


def _check_join(sep: str, items: object) -> None:
    """`items` is a list here: iterators are listed before the check."""
    if isinstance(items, (list, tuple)):
        _need(_weight(items) + len(sep) * len(items))
    elif isinstance(items, (str, dict)):
        _need(len(items) * (len(sep) + 1))


# str method -> check taking (the string, the call's arguments).
_STR_METHOD_CHECKS = {
    "center": _check_width,
    "ljust": _check_width,
    "rjust": _check_width,
    "zfill": _check_width,
    "expandtabs": lambda s, tabsize=8: _need(len(s) * (tabsize if _is_int(tabsize) else 8)),
    "replace": _check_replace,
    "join": _check_join,
    "translate": lambda s, table: _need(
        len(s) * max(map(_weight, dict(table).values()), default=1)
    ),
    "format": lambda fmt, *args, **kwargs: _check_format(fmt, [*args, *kwargs.values()]),
    "format_map": _check_format,
}


def _listed(args: tuple, index: int) -> tuple:
    """`args` with args[index] turned into a list if it is a one-shot iterator."""
    value = args[index]
    if isinstance(value, (str, list, tuple, dict)) or not hasattr(value, "__iter__"):
        return args
    return (*args[:index], list(value), *args[index + 1 :])


def _check_fill(count: object, fill_with: object) -> None:
    if fill_with is not None and _is_int(count):
        _need(_weight(fill_with) * max(count, 0))


def _check_indent(s: object, width: object = 4, *_: object, **__: object) -> None:
    pad = len(width) if isinstance(width, str) else width if _is_int(width) else 0
    _need(len(str(s)) + (str(s).count("\n") + 1) * max(pad, 0))


def _check_json_indent(indent: object) -> None:
    if (len(indent) if isinstance(indent, str) else indent or 0) > _MAX_JSON_INDENT:
        raise _BudgetExceeded(f"tojson indent over {_MAX_JSON_INDENT}")


# Filter -> check with the filter's own parameters (pass_eval_context ones get eval_ctx first).
_FILTER_CHECKS = {
    "center": lambda value, width=80: _check_width(str(value), width),
    "indent": _check_indent,
    "replace": lambda eval_ctx, s, old, new, count=None: _check_replace(str(s), old, new),
    "join": lambda eval_ctx, value, d="", attribute=None: _check_join(str(d), value),
    "format": lambda value, *args, **kwargs: _check_format(str(value), kwargs or args),
    # Bound as if every character started a line.
    "wordwrap": lambda env, s, width=79, long=True, wrapstring=None, *_, **__: _need(
        len(str(s)) * (1 + len(str(wrapstring or "\n")))
    ),
    "batch": lambda value, linecount, fill_with=None: _check_fill(linecount, fill_with),
    "slice": lambda value, slices, fill_with=None: _check_fill(slices, fill_with),
    "tojson": lambda value, ascii=False, indent=None, *_, **__: _check_json_indent(indent),
}


def _guard_filter(name: str, func):
    """The filter, with its budget check before and the result charged after."""
    check = _FILTER_CHECKS.get(name)

    @functools.wraps(func)  # keeps jinja's pass_context/pass_eval_context marker
    def guarded(*args, **kwargs):
        budget = _BUDGET.get()
        budget.tick()
        if name == "join":
            args = _listed(args, 1)
        if check is not None:
            check(*args, **kwargs)
        return budget.charge(func(*args, **kwargs))

    return guarded


class _BudgetCodeGenerator(CodeGenerator):
    """Compiles every for-loop to iterate through `budget_iter` and every `~` through
    `budget_concat`, so even a loop whose body calls nothing is stopped by the budget."""

    def visit_For(self, node: nodes.For, frame) -> None:
        guarded = nodes.For(
            node.target,
            nodes.Call(nodes.EnvironmentAttribute("budget_iter"), [node.iter], [], None, None),
            node.body,
            node.else_,
            node.test,
            node.recursive,
            lineno=node.lineno,
        )
        super().visit_For(guarded, frame)

    def visit_Concat(self, node: nodes.Concat, frame) -> None:
        self.write("environment.budget_concat(")
        super().visit_Concat(node, frame)
        self.write(")")


class _Environment(ImmutableSandboxedEnvironment):
    code_generator_class = _BudgetCodeGenerator
    intercepted_binops = frozenset(_BINOP_CHECKS)

    def call(self, context, obj, /, *args, **kwargs):
        budget = _BUDGET.get()
        budget.tick()
        target = getattr(obj, "__wrapped__", obj)  # the sandbox wraps str.format
        owner = getattr(target, "__self__", None)
        check = _STR_METHOD_CHECKS.get(getattr(target, "__name__", ""))
        if isinstance(owner, str) and check is not None:
            if check is _check_join and args:
                args = _listed(args, 0)
            check(owner, *args, **kwargs)
        return budget.charge(super().call(context, obj, *args, **kwargs))

    def call_binop(self, context, operator, left, right):
        _BINOP_CHECKS[operator](left, right)
        return _BUDGET.get().charge(super().call_binop(context, operator, left, right))

    def unsafe_undefined(self, obj, attribute):
        """Fail at once instead of rendering an empty Undefined."""
        raise SecurityError(
            f"access to attribute {attribute!r} of a {type(obj).__name__} is unsafe"
        )

    @staticmethod
    def budget_iter(iterable):
        budget = _BUDGET.get()
        for item in iterable:
            budget.tick()
            yield item

    @staticmethod
    def budget_concat(text: str) -> str:
        return _BUDGET.get().charge(text)


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (transformers' assistant-mask marker): the body."""

    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


class _Namespace(Namespace):
    """namespace() that refuses underscore names, as transformers' TemplateNamespace."""

    def __init__(self, /, *args, **kwargs) -> None:
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _check_namespace_name(name)
        Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: object) -> None:
        _check_namespace_name(name)
        Namespace.__setitem__(self, name, value)


def _check_namespace_name(name: object) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise SecurityError(f"namespace attribute {name!r} may not start with an underscore")


class _TemplateDict:
    """The `dict` global: builds dicts, without exposing the dict type itself."""

    def __call__(self, *args, **kwargs) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, keys, value=None) -> dict:
        keys = list(keys)
        _need(len(keys) * max(_weight(value), 1))
        return dict.fromkeys(keys, value)


def _raise_exception(message: object) -> None:
    raise _TemplateRaised(str(message))


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _make_environment() -> _Environment:
    env = _Environment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, _GenerationTag]
    )
    env.filters["tojson"] = _tojson
    env.filters = {name: _guard_filter(name, f) for name, f in env.filters.items()}
    del env.globals["lipsum"]  # lipsum(n) is an unbounded text generator
    env.globals.update(
        raise_exception=_raise_exception,
        strftime_now=lambda fmt: datetime.now().strftime(fmt),
        dict=_TemplateDict(),
        namespace=_Namespace,
    )
    return env


_ENV = _make_environment()


@functools.lru_cache(maxsize=32)
def _compile(template: str) -> jinja2.Template:
    try:
        return _ENV.from_string(template)
    except TemplateSyntaxError as exc:
        raise ChatTemplateError(
            f"chat template syntax error at line {exc.lineno}: {exc.message}"
        ) from None
    except Exception as exc:  # e.g. RecursionError on absurd nesting
        raise ChatTemplateError(f"chat template does not compile: {exc!r}") from None


def check_chat_template(template: str) -> None:
    """ChatTemplateError (VLLM_ERR_INVALID_ARGUMENT) if the template does not compile."""
    _compile(template)


def _plain(value: object, where: str) -> object:
    """A copy of `value` made only of JSON types, so the template sees no foreign methods."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, Mapping):
        return {_plain(k, where): _plain(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    for base in (str, int, float):  # subclasses (enums, numpy floats) -> the base value
        if isinstance(value, base):
            return getattr(base, f"__{base.__name__}__")(value)
    raise InvalidArgumentError(f"{where}: a {type(value).__name__} cannot be passed to a template")


def _text_content(content: object, where: str) -> str:
    """vLLM's text-only content: None -> "", text parts joined by newlines."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidArgumentError(f"{where} must be a string, null or a list of content parts")
    texts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if isinstance(part, str):
            texts.append(part)
        elif kind in _TEXT_PART_TYPES and isinstance(part.get("text"), str):
            texts.append(part["text"])
        else:
            raise InvalidArgumentError(
                f"{where}[{i}]: content part of type {kind!r} is not supported; "
                "this model takes text parts only"
            )
    return "\n".join(texts)


def _normalize_messages(messages: object) -> list[dict]:
    if not isinstance(messages, list):
        raise InvalidArgumentError("messages must be a list of dicts")
    normalized = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise InvalidArgumentError(f"{where} must be a dict, got {type(message).__name__}")
        if not isinstance(message.get("role"), str):
            raise InvalidArgumentError(f"{where} needs a string 'role'")
        plain = {
            k: _plain(v, f"{where}[{k!r}]")
            for k, v in message.items()
            if v is not None and k != "content"
        }
        plain["content"] = _text_content(message.get("content"), f"{where}['content']")
        normalized.append(plain)
    return normalized


def _render(template: jinja2.Template, variables: dict) -> str:
    budget = _Budget()
    token = _BUDGET.set(budget)
    try:
        chunks, size = [], 0
        for chunk in template.generate(**variables):
            size += len(chunk)
            if size > MAX_OUTPUT_CHARS:
                raise _BudgetExceeded(f"output exceeds {MAX_OUTPUT_CHARS} characters")
            budget.tick()
            chunks.append(chunk)
        return "".join(chunks)
    finally:
        _BUDGET.reset(token)


def render_chat_template(
    template: str,
    messages: list[dict],
    *,
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
    tools: list[dict] | None = None,
    **kwargs,
) -> str:
    """The prompt `template` renders for `messages`. Extra keyword arguments (e.g.
    enable_thinking, documents) are passed to the template as variables."""
    if not isinstance(template, str):
        raise InvalidArgumentError("chat template must be a string")
    if not isinstance(bos_token, str) or not isinstance(eos_token, str):
        raise InvalidArgumentError("bos_token and eos_token must be strings")
    try:
        variables = {"documents": None, **{k: _plain(v, k) for k, v in kwargs.items()},
                     "messages": _normalize_messages(messages), "tools": _plain(tools, "tools"),
                     "add_generation_prompt": bool(add_generation_prompt),
                     "bos_token": bos_token, "eos_token": eos_token}
    except RecursionError:
        raise ChatTemplateError("the messages or tools are nested too deeply") from None
    compiled = _compile(template)
    try:
        return _render(compiled, variables)
    except _TemplateRaised as exc:
        raise ChatTemplateError(f"chat template raised an error: {exc}") from None
    except _BudgetExceeded as exc:
        raise ChatTemplateError(f"chat template exceeded its work budget: {exc}") from None
    except SecurityError as exc:
        raise ChatTemplateError(f"chat template attempted an unsafe operation: {exc}") from None
    except Exception as exc:  # the template is untrusted code: any failure is its own
        raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from exc
