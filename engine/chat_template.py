"""Chat templates: render a model's Jinja chat template over a conversation, sandboxed.

Owns compiling (cached) and rendering untrusted templates. Mirrors transformers'
utils/chat_template_utils.py (`_compile_jinja_template`, `render_jinja_template`): an
ImmutableSandboxedEnvironment (trim_blocks, lstrip_blocks, loopcontrols) with
`raise_exception`, `strftime_now`, a non-escaping `tojson`, a `namespace` refusing underscore
names, a plain `dict`, and `{% generation %}` blocks rendering their body. Message content
follows vllm/entrypoints/chat_utils.py for text-only models: None -> "", text parts joined
by newlines.

Each render runs under a work budget (engine/chat_template_budget.py): wall time, output
size, the size of any one value, and the characters all operations produce together;
operations whose result would not fit are refused up front. Every failure (compile error,
sandbox violation, budget, raise_exception) raises ChatTemplateError.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.compiler import CodeGenerator
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from libvllm.engine.chat_template_budget import (
    BINOP_CHECKS,
    BUDGET,
    MAX_OUTPUT_CHARS,
    STR_METHOD_CHECKS,
    Budget,
    BudgetExceeded,
    check_join,
    guard_filter,
    listed,
    need,
    weight,
)
from libvllm.engine.errors import InvalidArgumentError

_TEXT_PART_TYPES = ("text", "input_text")


class ChatTemplateError(InvalidArgumentError):
    """The chat template failed to compile or render, or exceeded its work budget."""


class _TemplateRaised(TemplateError):
    """raise_exception() called by the template."""


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
    intercepted_binops = frozenset(BINOP_CHECKS)

    def call(self, context, obj, /, *args, **kwargs):
        budget = BUDGET.get()
        budget.tick()
        target = getattr(obj, "__wrapped__", obj)  # the sandbox wraps str.format
        owner = getattr(target, "__self__", None)
        check = STR_METHOD_CHECKS.get(getattr(target, "__name__", ""))
        if isinstance(owner, str) and check is not None:
            if check is check_join and args:
                args = listed(args, 0)
            check(owner, *args, **kwargs)
        return budget.charge(super().call(context, obj, *args, **kwargs))

    def call_binop(self, context, operator, left, right):
        BINOP_CHECKS[operator](left, right)
        return BUDGET.get().charge(super().call_binop(context, operator, left, right))

    def unsafe_undefined(self, obj, attribute):
        """Fail at once instead of rendering an empty Undefined."""
        raise SecurityError(
            f"access to attribute {attribute!r} of a {type(obj).__name__} is unsafe"
        )

    @staticmethod
    def budget_iter(iterable):
        budget = BUDGET.get()
        for item in iterable:
            budget.tick()
            yield item

    @staticmethod
    def budget_concat(text: str) -> str:
        return BUDGET.get().charge(text)


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
        need(len(keys) * max(weight(value), 1))
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
    env.filters = {name: guard_filter(name, f) for name, f in env.filters.items()}
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
    budget = Budget()
    token = BUDGET.set(budget)
    try:
        chunks, size = [], 0
        for chunk in template.generate(**variables):
            size += len(chunk)
            if size > MAX_OUTPUT_CHARS:
                raise BudgetExceeded(f"output exceeds {MAX_OUTPUT_CHARS} characters")
            budget.tick()
            chunks.append(chunk)
        return "".join(chunks)
    finally:
        BUDGET.reset(token)


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
    except BudgetExceeded as exc:
        raise ChatTemplateError(f"chat template exceeded its work budget: {exc}") from None
    except SecurityError as exc:
        raise ChatTemplateError(f"chat template attempted an unsafe operation: {exc}") from None
    except Exception as exc:  # the template is untrusted code: any failure is its own
        raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from exc
