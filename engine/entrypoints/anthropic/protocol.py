"""Anthropic Messages API request models and the error body.

Mirrors vllm/entrypoints/anthropic/protocol.py: AnthropicMessagesRequest (max_tokens
required and positive, model required, thinking.budget_tokens >= 1024 and below max_tokens),
AnthropicCountTokensRequest, content blocks, tools (input_schema "type" defaults to
"object"), tool_choice (a name for type "tool"), translate_error_type and
AnthropicErrorResponse ({"type": "error", "error": {"type", "message"}}).
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from libvllm.engine.entrypoints.openai.errors import error_response

_ERROR_TYPE_BY_STATUS = {
    HTTPStatus.BAD_REQUEST.value: "invalid_request_error",
    HTTPStatus.UNAUTHORIZED.value: "authentication_error",
    HTTPStatus.FORBIDDEN.value: "permission_error",
    HTTPStatus.NOT_FOUND.value: "not_found_error",
    HTTPStatus.REQUEST_ENTITY_TOO_LARGE.value: "request_too_large",
    HTTPStatus.TOO_MANY_REQUESTS.value: "rate_limit_error",
    HTTPStatus.SERVICE_UNAVAILABLE.value: "overloaded_error",
}


def translate_error_type(status_code: int) -> str:
    """An HTTP status as Anthropic's error.type."""
    error_type = _ERROR_TYPE_BY_STATUS.get(status_code)
    if error_type is not None:
        return error_type
    return "api_error" if status_code >= 500 else "invalid_request_error"


def error_body(exc: BaseException) -> tuple[int, dict]:
    """The HTTP status (as the OpenAI layer maps `exc`) and Anthropic's error body."""
    status, body = error_response(exc)
    return status, {"type": "error", "error": {"type": translate_error_type(status),
                                               "message": body["error"]["message"]}}


def error_json(exc: BaseException) -> tuple[int, str]:
    status, body = error_body(exc)
    return status, json.dumps(body)


def stop_reason(finish_reason: str | None, stop: int | str | None, tool_used: bool,
                tool_complete: bool) -> tuple[str | None, str | None]:
    """vLLM's _to_anthropic_stop_reason: (stop_reason, stop_sequence)."""
    if finish_reason == "length":
        return "max_tokens", None
    if finish_reason not in ("stop", "tool_calls"):
        return None, None
    if tool_complete:
        return "tool_use", None
    if isinstance(stop, str):
        return "stop_sequence", stop
    if finish_reason == "tool_calls" or tool_used:
        return "tool_use", None
    return "end_turn", None


def usage(chat_usage: dict | None) -> dict:
    """vLLM's _build_anthropic_usage (no prompt-token details here: no cache fields)."""
    if chat_usage is None:
        return {"input_tokens": 0, "output_tokens": 0}
    return {"input_tokens": max(0, chat_usage.get("prompt_tokens") or 0),
            "output_tokens": chat_usage.get("completion_tokens") or 0}


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class ContentBlock(_Model):
    type: Literal["text", "image", "tool_use", "tool_result", "tool_reference", "thinking",
                  "redacted_thinking"]
    text: str | None = None
    source: dict[str, Any] | None = None
    id: str | None = None
    tool_use_id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None
    content: str | list[dict[str, Any]] | None = None
    is_error: bool | None = None
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None


class Message(_Model):
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]


class Tool(_Model):
    name: str
    description: str | None = None
    input_schema: dict[str, Any]
    strict: bool | None = None

    @field_validator("input_schema")
    @classmethod
    def _default_type(cls, v: dict) -> dict:
        v.setdefault("type", "object")
        return v


class ToolChoice(_Model):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _name_for_tool(self) -> ToolChoice:
        if self.type == "tool" and not self.name:
            raise ValueError("tool_choice.name is required when type is 'tool'")
        return self


class ThinkingEnabled(_Model):
    type: Literal["enabled"]
    budget_tokens: int = Field(ge=1024)


class ThinkingDisabled(_Model):
    type: Literal["disabled"]


class ThinkingAdaptive(_Model):
    type: Literal["adaptive"]


Thinking = Annotated[ThinkingEnabled | ThinkingDisabled | ThinkingAdaptive,
                     Field(discriminator="type")]


class JsonOutputFormat(_Model):
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    type: Literal["json_schema"] = "json_schema"


class OutputConfig(_Model):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: JsonOutputFormat | None = None


class CountTokensRequest(_Model):
    model: str
    messages: list[Message]
    output_config: OutputConfig | None = None
    system: str | list[ContentBlock] | None = None
    thinking: Thinking | None = None
    tool_choice: ToolChoice | None = None
    tools: list[Tool] | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("model")
    @classmethod
    def _model_required(cls, v: str) -> str:
        if not v:
            raise ValueError("Model is required")
        return v


class MessagesRequest(CountTokensRequest):
    max_tokens: int
    metadata: dict[str, Any] | None = None
    stop_sequences: list[str] | None = None
    stream: bool | None = False
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    cache_salt: str | None = Field(default=None, min_length=1, max_length=1024)
    vllm_xargs: dict[str, Any] | None = None

    @field_validator("max_tokens")
    @classmethod
    def _positive(cls, v: int) -> int:
        if v <= 0:
            raise ValueError("max_tokens must be positive")
        return v

    @model_validator(mode="after")
    def _budget_below_max(self) -> MessagesRequest:
        if isinstance(self.thinking, ThinkingEnabled) and \
                self.thinking.budget_tokens >= self.max_tokens:
            raise ValueError("thinking.budget_tokens must be less than max_tokens")
        return self
