"""Tool-call and delta message models shared by the tool and reasoning parsers.

Mirrors the tool-call part of vllm/entrypoints/generate/base/protocol.py (`FunctionCall`,
`ToolCall`, `DeltaFunctionCall`, `DeltaToolCall`, `DeltaMessage`,
`ExtractedToolCallInformation`) and `make_tool_call_id` of
vllm/renderers/chat_utils/tool_call.py. Field names are the OpenAI wire names.
"""

from __future__ import annotations

import uuid
from typing import Literal

from pydantic import BaseModel, Field, model_serializer


def make_tool_call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text


class ToolCall(BaseModel):
    id: str = Field(default_factory=make_tool_call_id)
    type: Literal["function"] = "function"
    function: FunctionCall


class DeltaFunctionCall(BaseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(BaseModel):
    id: str | None = None
    type: Literal["function"] | None = None
    index: int
    function: DeltaFunctionCall | None = None


class OmitEmptyToolCalls(BaseModel):
    """`tool_calls` is left out of the JSON when empty, as vLLM's responses show it."""

    @model_serializer(mode="wrap")
    def _serialize(self, handler):
        data = handler(self)
        if not data.get("tool_calls"):
            data.pop("tool_calls", None)
        return data


class DeltaMessage(OmitEmptyToolCalls):
    role: str | None = None
    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[DeltaToolCall] = Field(default_factory=list)


class ExtractedToolCallInformation(BaseModel):
    tools_called: bool
    tool_calls: list[ToolCall]
    content: str | None = None
