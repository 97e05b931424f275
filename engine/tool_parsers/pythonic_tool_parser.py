"""Pythonic tool calls (Llama 3.2 / 4 style): `[get_weather(city='SF'), get_time()]`.

Mirrors vllm/tool_parsers/pythonic_tool_parser.py (`PythonicToolParser`, vLLM 0.33) and the
AST helpers of vllm/tool_parsers/utils.py it uses (`get_parameter_value`,
`handle_single_tool`, `make_valid_python`, `compute_tool_delta`). Parsing is `ast.parse`
only (never evaluation); streaming closes the open brackets/quotes of the partial text,
parses it, and withholds the auto-closed suffix from the argument deltas.
"""

from __future__ import annotations

import ast
import json
import logging
from collections.abc import Sequence
from typing import Any

import regex as re

from libvllm.engine.tool_parsers.abstract_tool_parser import ToolParser
from libvllm.engine.tool_parsers.protocol import (
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    ExtractedToolCallInformation,
    FunctionCall,
    ToolCall,
)

logger = logging.getLogger(__name__)
REGEX_TIMEOUT_S = 1  # VLLM_TOOL_PARSE_REGEX_TIMEOUT_SECONDS
_JSON_NAMES = {"null": None, "true": True, "false": False}
_CLOSING = {"[": "]", "(": ")", "{": "}", "'": "'", '"': '"'}


class UnexpectedAstError(Exception):
    """The text is not a list of calls with literal arguments."""


def get_parameter_value(val: ast.expr) -> Any:
    """A JSON-representable literal from an argument node (lists for tuples and sets)."""
    if isinstance(val, ast.Constant):
        if val.value is None or isinstance(val.value, (str, int, float)):
            return val.value
        raise UnexpectedAstError("Tool call arguments must be JSON values")
    if isinstance(val, ast.Dict):
        if not all(isinstance(k, ast.Constant) for k in val.keys):
            raise UnexpectedAstError("Dict tool call arguments must have literal keys")
        return {k.value: get_parameter_value(v) for k, v in zip(val.keys, val.values)}
    if isinstance(val, (ast.List, ast.Tuple, ast.Set)):
        return [get_parameter_value(v) for v in val.elts]
    if isinstance(val, ast.JoinedStr) and all(isinstance(p, ast.Constant) for p in val.values):
        return "".join(str(p.value) for p in val.values)
    if isinstance(val, ast.Name) and val.id in _JSON_NAMES:
        return _JSON_NAMES[val.id]
    if isinstance(val, ast.UnaryOp) and isinstance(val.op, (ast.USub, ast.UAdd)):
        operand = get_parameter_value(val.operand)
        if isinstance(operand, (int, float)) and not isinstance(operand, bool):
            return -operand if isinstance(val.op, ast.USub) else operand
    raise UnexpectedAstError("Tool call arguments must be literals")


def _dotted_name(node: ast.expr) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        raise UnexpectedAstError("Invalid tool call name")
    return ".".join(reversed([*parts, node.id]))


def handle_single_tool(call: ast.Call) -> ToolCall:
    arguments = {kw.arg: get_parameter_value(kw.value) for kw in call.keywords}
    return ToolCall(
        function=FunctionCall(
            name=_dotted_name(call.func), arguments=json.dumps(arguments, ensure_ascii=False)
        )
    )


def _parse_calls(text: str) -> list[ToolCall]:
    parsed = getattr(ast.parse(text).body[0], "value", None)
    if not isinstance(parsed, ast.List) or not all(isinstance(e, ast.Call) for e in parsed.elts):
        raise UnexpectedAstError("Tool output must be a list of function calls")
    return [handle_single_tool(e) for e in parsed.elts]


def _is_escaped(text: str, index: int) -> bool:
    j = index - 1
    while j >= 0 and text[j] == "\\":
        j -= 1
    return (index - 1 - j) % 2 == 1


def _bracket_stack(text: str) -> list[str]:
    stack: list[str] = []
    for i, ch in enumerate(text):
        if stack and stack[-1] in "'\"":
            if ch == stack[-1] and not _is_escaped(text, i):
                stack.pop()
        elif ch in "[({'\"":
            stack.append(ch)
        elif ch in "])}":
            if not stack or _CLOSING[stack.pop()] != ch:
                raise UnexpectedAstError("Mismatched brackets")
    return stack


def make_valid_python(text: str) -> tuple[str, str] | None:
    """(text with its open brackets/quotes closed, the added suffix), or None when the text
    stops somewhere a completion would be a guess (after `=`, mid key, mid name)."""
    stack = _bracket_stack(text)
    text = text.rstrip()
    if text.endswith(("=", ":")):
        return None
    if stack and stack[-1] == "{":
        before = text[: text.rfind("{")]
        if before.count(":") <= before.count(","):
            return None
    if stack and stack[-1] == "(":
        before = text[: text.rfind("(")]
        if before.count("=") <= before.count(","):
            return None
    if text.endswith(","):
        text = text[:-1]
    if stack and stack[-1] == "[" and not text.endswith(("[", ")")):
        return None
    added = "".join(_CLOSING[ch] for ch in reversed(stack))
    try:
        module = ast.parse(text + added)
    except SyntaxError:
        return None
    if not module.body:
        return None
    if "}" in added and any(isinstance(n, ast.Set) for n in ast.walk(module)):
        return None  # `{"k` closed as a set is a truncated dict
    return text + added, added


def compute_tool_delta(
    sent: str, call: ToolCall, index: int, withheld: str
) -> DeltaToolCall | None:
    """The delta from `sent` to the call's arguments minus the auto-closed `withheld`."""
    args = call.function.arguments
    if withheld:
        if not args.endswith(withheld):
            raise ValueError(f"arguments {args!r} do not end with the withheld {withheld!r}")
        args = args[: -len(withheld)]
    if not sent:
        return DeltaToolCall(
            id=call.id,
            type="function",
            index=index,
            function=DeltaFunctionCall(name=call.function.name, arguments=args),
        )
    diff = args[len(sent) :]
    return DeltaToolCall(index=index, function=DeltaFunctionCall(arguments=diff)) if diff else None


class PythonicToolParser(ToolParser):
    TOOL_CALL_REGEX = re.compile(
        r"\[([a-zA-Z]+\w*\(([a-zA-Z]+\w*=.*,\s*)*([a-zA-Z]+\w*=.*\s)?\),\s*)*"
        r"([a-zA-Z]+\w*\(([a-zA-Z]+\w*=.*,\s*)*([a-zA-Z]+\w*=.*\s*)?\)\s*)+\]",
        re.DOTALL,
    )

    def extract_tool_calls(
        self, model_output: str, request: Any = None
    ) -> ExtractedToolCallInformation:
        no_calls = ExtractedToolCallInformation(
            tools_called=False, tool_calls=[], content=model_output
        )
        try:
            if self.TOOL_CALL_REGEX.match(model_output, timeout=REGEX_TIMEOUT_S) is None:
                return no_calls
        except TimeoutError:
            logger.warning("Regex timeout occurred when matching tool call pattern.")
            return no_calls
        try:
            return ExtractedToolCallInformation(
                tools_called=True, tool_calls=_parse_calls(model_output)
            )
        except Exception:
            logger.debug("Error in extracting tool call from response.", exc_info=True)
            return no_calls

    def extract_tool_calls_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
        request: Any = None,
    ) -> DeltaMessage | None:
        if not current_text.startswith("["):
            return DeltaMessage(content=delta_text)
        try:
            valid = make_valid_python(current_text)
            if valid is None:
                return None
            valid_text, added = valid
            calls = _parse_calls(valid_text)
            deltas = []
            for index, call in enumerate(calls):
                if index < self.current_tool_id:
                    continue
                self.current_tool_id = index
                if len(self.streamed_args_for_tool) == index:
                    self.streamed_args_for_tool.append("")
                complete = index < len(calls) - 1 or ")]" not in added
                if complete:
                    self.current_tool_id += 1
                withheld = added[:-2] if not complete else ""
                if not complete and added[-2] == ")":
                    withheld += "}"  # the arguments object of an unfinished call
                withheld = withheld.replace("'", '"')  # JSON quotes in the arguments
                delta = compute_tool_delta(
                    self.streamed_args_for_tool[index], call, index, withheld
                )
                if delta is not None:
                    deltas.append(delta)
                    self.streamed_args_for_tool[index] += delta.function.arguments or ""
            if deltas and not self.prev_tool_call_arr:
                self.prev_tool_call_arr = [{"arguments": {}}]  # finish_reason tool_calls
            if deltas:
                return DeltaMessage(tool_calls=deltas)
            if not added and self.current_tool_id > 0:
                return DeltaMessage(content="")  # all calls done
            return None
        except Exception:
            logger.debug("Error trying to handle streaming tool call.", exc_info=True)
            return None
