"""ToolParser base class and the `--tool-call-parser` registry.

Mirrors vllm/tool_parsers/abstract_tool_parser.py (vLLM 0.33): `extract_tool_calls` for a
finished output, `extract_tool_calls_streaming` for one delta (state kept on the instance,
one instance per request), `adjust_request`'s tool_choice -> JSON-schema rule as
`structured_outputs_for_tools`, and `ToolParserManager`. The tokenizer is our
engine.tokenizer.Tokenizer; `request` may be None, a dict or an object with `tools` /
`tool_choice` attributes (only mistral reads it).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import Any

from libvllm.engine.structured_output.params import StructuredOutputsParams
from libvllm.engine.tool_parsers.protocol import (
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    ExtractedToolCallInformation,
    make_tool_call_id,
)
from libvllm.engine.tool_parsers.tool_choice_schema import get_json_schema_from_tools


def request_field(request: Any, name: str, default: Any = None) -> Any:
    if isinstance(request, dict):
        return request.get(name, default)
    return getattr(request, name, default)


class ToolParser:
    """Base class; one instance per request (streaming state lives here)."""

    # required / named tool_choice are enforced with the generic JSON-array schema and
    # parsed by tool_choice.extract_forced_tool_calls (False: the parser parses them).
    supports_required_and_named: bool = True
    # The OpenAI layer must detokenize with skip_special_tokens=False when tools are on,
    # so markers that are special tokens reach the parser.
    keep_special_tokens: bool = False
    # xgrammar / vLLM structural-tag model of the parser's call syntax: tool_choice "auto"
    # with strict tools constrains calls with it (engine/tool_parsers/structural_tag.py)
    structural_tag_model: str | None = None

    def __init__(self, tokenizer: Any, tools: list | None = None) -> None:
        self.prev_tool_call_arr: list[dict] = []
        self.current_tool_id: int = -1
        self.current_tool_name_sent: bool = False
        self.streamed_args_for_tool: list[str] = []
        self.model_tokenizer = tokenizer
        self.tools = list(tools or [])

    @cached_property
    def vocab(self) -> dict[str, int]:
        return self.model_tokenizer.backend.get_vocab(with_added_tokens=True)

    def structured_outputs_for_tools(
        self, tool_choice: Any, parallel_tool_calls: bool | None = None
    ) -> StructuredOutputsParams | None:
        """The constraint enforcing tool_choice required/named (None for auto/none)."""
        if not self.tools or not self.supports_required_and_named:
            return None
        schema = get_json_schema_from_tools(tool_choice, self.tools, parallel_tool_calls)
        return None if schema is None else StructuredOutputsParams(json=schema)

    def get_remaining_unstreamed_args(self) -> str:
        """Arguments of the last tool parsed but not streamed yet (for the final delta)."""
        if not self.prev_tool_call_arr:
            return ""
        index = len(self.prev_tool_call_arr) - 1
        args = self.prev_tool_call_arr[index].get("arguments", {})
        expected = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        streamed = self.streamed_args_for_tool
        sent = streamed[index] if index < len(streamed) else ""
        return expected[len(sent) :] if expected.startswith(sent) else ""

    def stream_call_deltas(
        self, calls: list[tuple[str, str]], make_id: Callable[[], str] = make_tool_call_id
    ) -> list[DeltaToolCall]:
        """Deltas from re-parsed (name, arguments so far) per call: a new call sends its id,
        type, name and arguments so far; a known one only the text its arguments grew by
        (`arguments` must extend what was sent, so the fragments concatenate)."""
        deltas = []
        for index, (name, args) in enumerate(calls):
            if index == len(self.streamed_args_for_tool):
                self.streamed_args_for_tool.append(args)
                self.prev_tool_call_arr.append({"name": name, "arguments": args})
                function = DeltaFunctionCall(name=name, arguments=args)
                deltas.append(
                    DeltaToolCall(index=index, id=make_id(), type="function", function=function)
                )
                continue
            sent = self.streamed_args_for_tool[index]
            if len(args) > len(sent) and args.startswith(sent):
                self.streamed_args_for_tool[index] = args
                self.prev_tool_call_arr[index]["arguments"] = args
                new = DeltaFunctionCall(arguments=args[len(sent) :])
                deltas.append(DeltaToolCall(index=index, function=new))
        return deltas

    def extract_tool_calls(
        self, model_output: str, request: Any = None
    ) -> ExtractedToolCallInformation:
        raise NotImplementedError

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
        raise NotImplementedError


class ToolParserManager:
    """`--tool-call-parser` name -> ToolParser class, imported lazily."""

    tool_parsers: dict[str, type[ToolParser]] = {}
    lazy_parsers: dict[str, tuple[str, str]] = {}

    @classmethod
    def register_lazy_module(cls, name: str, module_path: str, class_name: str) -> None:
        cls.lazy_parsers[name] = (module_path, class_name)

    @classmethod
    def get_tool_parser(cls, name: str) -> type[ToolParser]:
        if name in cls.tool_parsers:
            return cls.tool_parsers[name]
        if name not in cls.lazy_parsers:
            raise KeyError(f"Tool parser '{name}' not found.")
        module_path, class_name = cls.lazy_parsers[name]
        parser_cls = getattr(importlib.import_module(module_path), class_name)
        if not issubclass(parser_cls, ToolParser):
            raise TypeError(f"{class_name} in {module_path} is not a ToolParser subclass.")
        cls.tool_parsers[name] = parser_cls
        return parser_cls

    @classmethod
    def list_registered(cls) -> list[str]:
        return sorted(set(cls.tool_parsers) | set(cls.lazy_parsers))
