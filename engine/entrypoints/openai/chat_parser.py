"""ChatParser: reasoning + tool-call extraction of one chat choice, whole or delta by delta.

Mirrors vllm/parser/abstract_parser.py (`DelegatingParser.parse`, `_extract_tool_calls`,
`parse_delta`, `_extract_tool_calls_streaming`, `finalize_generation`), the tool_choice gates
of vllm/entrypoints/openai/chat_completion/message_assembly.py (`keeps_tool_calls`,
`assemble_chat_message_fields`), vllm/entrypoints/serve/utils/tool_calls_utils.py
(`resolve_finish_reason`, `maybe_filter_parallel_tool_calls`) and the tool_choice checks of
vllm/renderers/online_renderer.py, and the tool_choice "auto" branch of `_apply_structural_tag`
(structural tags: engine/tool_parsers/structural_tag.py). Not here: engine-based parsers,
Kimi-style call ids.

Reasoning is split first (the reasoning parser), then tool calls are taken from the
content: named / required from the JSON that structured outputs forced, auto by the
`--tool-call-parser`. One instance per choice: the parsers keep streaming state.
"""

from __future__ import annotations

from libvllm.engine.entrypoints.openai.chat_render import chat_template_kwargs
from libvllm.engine.entrypoints.openai.errors import VLLMValidationError
from libvllm.engine.structured_output.params import StructuredOutputsParams
from libvllm.engine.tool_parsers.protocol import DeltaMessage, ToolCall
from libvllm.engine.tool_parsers.streaming import (
    extract_named_tool_call_streaming,
    extract_required_tool_call_streaming,
)
from libvllm.engine.tool_parsers.structural_tag import (
    strict_tool_calling_enforced,
    tool_structural_tag,
)
from libvllm.engine.tool_parsers.tool_choice import extract_forced_tool_calls, named_tool_choice


def check_tool_choice(request, tool_parser_cls, enable_auto_tools: bool) -> None:
    """online_renderer.py: tool choices that need a parser the server does not have."""
    choice = request.tool_choice
    if tool_parser_cls is not None or choice in (None, "none"):
        return
    if choice == "auto":
        if not enable_auto_tools:
            raise VLLMValidationError('"auto" tool choice requires --enable-auto-tool-choice '
                                      "and --tool-call-parser to be set")
        return
    name = named_tool_choice(choice)
    desc = f'function "{name}"' if name is not None else f'"{choice}"'
    raise VLLMValidationError(f"tool_choice={desc} requires --tool-call-parser to be set")


class ChatParser:
    def __init__(self, tokenizer, request, tool_parser_cls, reasoning_parser_cls,
                 enable_auto_tools: bool, structural_tags: bool = True) -> None:
        self.request = request
        kwargs = {"chat_template_kwargs": chat_template_kwargs(request)}
        self.reasoner = reasoning_parser_cls(tokenizer, **kwargs) \
            if reasoning_parser_cls is not None else None
        self.tool_parser = tool_parser_cls(tokenizer, request.tools) \
            if tool_parser_cls is not None and request.tools else None
        choice = request.tool_choice
        self.named = named_tool_choice(choice)
        forced = self.named is not None or choice == "required"
        # a parser with a structural-tag model constrains and parses every tool_choice in
        # its own syntax (vLLM's __init_subclass__ rule under VLLM_ENFORCE_STRICT_TOOL_CALLING);
        # not with --structured-outputs-backend guidance, which reads no xgrammar tag
        self.tag_model = self.tool_parser.structural_tag_model if self.tool_parser is not None \
            and structural_tags and strict_tool_calling_enforced() else None
        supports = self.tool_parser is not None and self.tag_model is None \
            and self.tool_parser.supports_required_and_named
        # keeps_tool_calls: forced choices, or auto with --enable-auto-tool-choice
        self.keeps_tool_calls = forced or (enable_auto_tools and self.tool_parser is not None
                                           and choice == "auto")
        self.forced_json = forced and supports  # parsed from the schema-forced JSON
        self.auto = self.tool_parser is not None and enable_auto_tools and (
            choice in ("auto", None) or (forced and not supports))
        # streaming state (vLLM's StreamState)
        self._previous_text, self._previous_ids = "", []
        self._reasoning_ended = self.reasoner is None
        self._prompt_checked = False
        self._tool_text_started = False
        self._name_returned = False

    # ------------------------------------------------------------ request side

    def tool_outputs(self, own: StructuredOutputsParams | None, strict_level=None
                     ) -> StructuredOutputsParams | None:
        """adjust_request: the constraint tool calling puts on the output, None to leave
        the request's own `own`: a structural tag for a parser with a structural-tag model
        (engine/tool_parsers/structural_tag.py; `own` ORed in for auto), else the JSON
        schema of required / named. strict_level: --tool-strict-level or None."""
        choice = self.request.tool_choice
        if self.tool_parser is None or not self.keeps_tool_calls or choice in ("none", None):
            return None
        if self.tag_model is not None:
            named = None if self.named is None else \
                {"type": "function", "function": {"name": self.named}}
            return tool_structural_tag(self.tag_model, self.request.tools, named or choice,
                                       self.request.parallel_tool_calls, own, strict_level)
        if choice == "auto":
            return None
        return self.tool_parser.structured_outputs_for_tools(choice,
                                                             self.request.parallel_tool_calls)

    def count_reasoning_tokens(self, token_ids) -> int:
        return 0 if self.reasoner is None else self.reasoner.count_reasoning_tokens(token_ids)

    @property
    def keep_special_tokens(self) -> bool:
        return self.tool_parser is not None and self.tool_parser.keep_special_tokens and \
            self.request.tool_choice != "none"

    # ------------------------------------------------------------ whole output

    def parse(self, text: str) -> tuple[str | None, str | None, list[ToolCall]]:
        reasoning, content = (None, text) if self.reasoner is None else \
            self.reasoner.extract_reasoning(text, self.request)
        if not self.request.include_reasoning:
            reasoning = None
        if not self.keeps_tool_calls:
            return reasoning, content, []
        calls, content = self._extract_tool_calls(content)
        if self.named is not None or self.request.tool_choice == "required":
            content = content or ""
        return reasoning, content, self._filter_parallel(calls)

    def _extract_tool_calls(self, content: str | None) -> tuple[list[ToolCall], str | None]:
        if self.forced_json:
            return extract_forced_tool_calls(content, self.request.tool_choice), None
        if not self.auto:
            return [], content
        info = self.tool_parser.extract_tool_calls(content or "", self.request)
        if not info.tools_called:
            forced = self.named is not None or self.request.tool_choice == "required"
            if forced and not (content or "").strip():
                return [], None
            return [], content
        content = info.content if info.content and info.content.strip() else None
        return list(info.tool_calls), content

    def _filter_parallel(self, calls: list[ToolCall]) -> list[ToolCall]:
        return calls[:1] if self.request.parallel_tool_calls is False else calls

    # ------------------------------------------------------------ deltas

    def parse_delta(self, delta_text: str, delta_ids: list[int], prompt_ids: list[int],
                    finished: bool) -> DeltaMessage | None:
        if not self._prompt_checked:
            self._prompt_checked = True
            if self.reasoner is not None and self.reasoner.is_reasoning_end(prompt_ids):
                self._reasoning_ended = True
        current_text = self._previous_text + delta_text
        current_ids = self._previous_ids + list(delta_ids)
        delta, transitioned = None, False
        if not self._reasoning_ended:
            delta = self.reasoner.extract_reasoning_streaming(
                self._previous_text, current_text, delta_text, self._previous_ids,
                current_ids, delta_ids)
            if self.reasoner.is_reasoning_end_streaming(current_ids, delta_ids):
                self._reasoning_ended = transitioned = True
                current_ids = self.reasoner.extract_content_ids(list(delta_ids))
                current_text = delta_text = (delta.content if delta else None) or ""
        if self._reasoning_ended and self.keeps_tool_calls:
            if not self._tool_text_started:  # tool parsing sees only the content
                self._tool_text_started = True
                self._previous_text, self._previous_ids = "", []
                delta_ids = current_ids
            reasoning = delta.reasoning if delta else None
            delta = self._tool_delta(current_text, delta_text, current_ids, delta_ids)
            if reasoning:
                delta = delta or DeltaMessage()
                delta.reasoning = delta.reasoning or reasoning
        elif delta is None and self._reasoning_ended and not transitioned:
            delta = DeltaMessage(content=delta_text)
        self._previous_text, self._previous_ids = current_text, current_ids
        if finished and self.auto and delta and delta.tool_calls and \
                delta.tool_calls[-1].function:  # finalize_generation
            last = delta.tool_calls[-1].function
            last.arguments = (last.arguments or "") + \
                self.tool_parser.get_remaining_unstreamed_args()
        if delta is not None and not self.request.include_reasoning:
            delta.reasoning = None
            if not delta.content and not delta.tool_calls:
                return None
        if delta is not None and self.request.parallel_tool_calls is False and delta.tool_calls:
            delta.tool_calls = [c for c in delta.tool_calls if c.index == 0]
        return delta

    def _tool_delta(self, current_text: str, delta_text: str, current_ids: list[int],
                    delta_ids: list[int]) -> DeltaMessage | None:
        if self.forced_json and self.named is not None:
            delta, self._name_returned = extract_named_tool_call_streaming(
                delta_text=delta_text, function_name=self.named,
                function_name_returned=self._name_returned)
            return delta
        if self.forced_json:
            delta, self._name_returned = extract_required_tool_call_streaming(
                previous_text=self._previous_text, current_text=current_text)
            return delta
        if not self.auto:
            return DeltaMessage(content=delta_text) if delta_text else None
        return self.tool_parser.extract_tool_calls_streaming(
            self._previous_text, current_text, delta_text, self._previous_ids, current_ids,
            delta_ids, self.request)


def resolve_finish_reason(engine_finish_reason: str | None, request,
                          tool_calls_made: bool) -> str:
    """tool_calls when the choice carries calls and stopped on its own, unless forced named."""
    finish_reason = engine_finish_reason or "stop"
    if tool_calls_made and finish_reason == "stop" and named_tool_choice(
            request.tool_choice) is None:
        return "tool_calls"
    return finish_reason
