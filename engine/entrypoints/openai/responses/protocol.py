"""/v1/responses request model and its translation into a chat completions request.

Mirrors vllm/entrypoints/openai/responses/protocol.py (ResponsesRequest fields, defaults and
validators: `prompt` refused, background only with store; to_sampling_params: temperature /
top_p / top_k / min_p with the model's defaults, text.format -> structured output) and
vllm/entrypoints/openai/responses/utils.py (construct_input_messages and
_construct_message_from_response_item: instructions -> a system message, a previous
response's stored messages without their system message and its output messages as
assistant turns, message / function_call / function_call_output / reasoning items -> chat
messages; convert_tool_responses_to_completions_format: flat function tools -> chat tools).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from libvllm.engine.entrypoints.openai.errors import VLLMValidationError, not_supported
from libvllm.engine.entrypoints.openai.protocol import (
    INT64_MAX,
    INT64_MIN,
    OpenAIBaseModel,
    Seed,
    StopParam,
    random_uuid,
    validate_cache_salt,
)

LOGPROBS_INCLUDE = "message.output_text.logprobs"


class ResponsesRequest(OpenAIBaseModel):
    input: str | list[dict[str, Any]]
    background: bool | None = False
    include: list[str] | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    metadata: dict[str, Any] | None = None
    model: str | None = None
    logit_bias: dict[str, float] | None = None
    parallel_tool_calls: bool | None = True
    previous_response_id: str | None = None
    previous_input_messages: list[dict[str, Any]] | None = None
    reasoning: dict[str, Any] | None = None
    include_reasoning: bool = True
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] = "auto"
    store: bool | None = True
    stream: bool | None = False
    temperature: float | None = None
    text: dict[str, Any] | None = None
    tool_choice: str | dict[str, Any] = "auto"
    tools: list[dict[str, Any]] = Field(default_factory=list)
    top_logprobs: int | None = Field(default=0, ge=0)
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    truncation: Literal["auto", "disabled"] | None = "disabled"
    user: str | None = None
    skip_special_tokens: bool | None = None
    include_stop_str_in_output: bool = False
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = None
    seed: Seed | None = None
    stop: StopParam = []
    stop_token_ids: list[int] | None = []
    ignore_eos: bool = False
    structured_outputs: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    cache_salt: str | None = Field(default=None, min_length=1, max_length=1024)
    priority: int = Field(default=0, ge=INT64_MIN, le=INT64_MAX)
    request_id: str = Field(default_factory=lambda: f"resp_{random_uuid()}")
    vllm_xargs: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _validate_before(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        validate_cache_salt(data.get("cache_salt"))
        if data.get("background") and not data.get("store", True):
            raise VLLMValidationError("background can only be used when `store` is true",
                                      parameter="background")
        if data.get("prompt") is not None:
            raise VLLMValidationError("prompt template is not supported", parameter="prompt")
        return data

    def include_logprobs(self) -> bool:
        return bool(self.include) and LOGPROBS_INCLUDE in self.include


def _text(content: Any) -> str | None:
    """The text of an output message's content: a string or its first part's text."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content and isinstance(content[0], dict):
        return content[0].get("text")
    return None


def _item_message(item: dict, prev: dict | None) -> dict | None:
    """One input item as a chat message; None when it was merged into `prev` (the previous
    assistant message: a function call, reasoning or text of the same turn)."""
    kind = item.get("type")
    assistant = prev if prev is not None and prev.get("role") == "assistant" else None
    if kind == "function_call":
        call = {"id": item.get("call_id"), "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments")}}
        if assistant is not None:
            assistant.setdefault("tool_calls", []).append(call)
            return None
        return {"role": "assistant", "tool_calls": [call]}
    if kind == "reasoning":
        if item.get("encrypted_content"):
            raise VLLMValidationError("Encrypted content is not supported.", parameter="input")
        parts = item.get("content") or item.get("summary") or []
        reasoning = _text(parts) or ""
        if assistant is not None and assistant.get("reasoning") is None:
            assistant["reasoning"] = reasoning
            return None
        return {"role": "assistant", "reasoning": reasoning}
    if kind == "function_call_output":
        return {"role": "tool", "content": item.get("output"), "tool_call_id": item.get("call_id")}
    if item.get("role") == "assistant":
        text = _text(item.get("content"))
        if text is not None:
            if assistant is not None and assistant.get("content") is None:
                assistant["content"] = text
                return None
            return {"role": "assistant", "content": text}
    if "role" in item and kind in (None, "message"):
        return {k: v for k, v in item.items() if k not in ("type", "status", "id")}
    raise VLLMValidationError(f"Unsupported input item type: {kind}", parameter="input")


def input_messages(request: ResponsesRequest, prev_messages: list[dict] | None,
                   prev_output: list[dict] | None) -> list[dict]:
    """vLLM's construct_input_messages: the chat messages of a request."""
    messages: list[dict] = []
    if request.instructions:
        messages.append({"role": "system", "content": request.instructions})
    if prev_messages is not None:  # instructions do not carry over (OpenAI's rule)
        messages.extend(m for m in prev_messages if m.get("role") != "system")
    for item in prev_output or ():  # vLLM keeps the output messages only
        if item.get("type") == "message":
            messages.extend({"role": "assistant", "content": part.get("text")}
                            for part in item.get("content") or ())
    if isinstance(request.input, str):
        messages.append({"role": "user", "content": request.input})
        return messages
    for item in request.input:
        message = _item_message(item, messages[-1] if messages else None)
        if message is not None:
            messages.append(message)
    return messages


def chat_tools(request: ResponsesRequest) -> list[dict] | None:
    """Flat Responses function tools as chat tools; other tool types need a tool server."""
    tools = []
    for tool in request.tools:
        if tool.get("type") != "function":
            raise not_supported(f"tools of type {tool.get('type')!r}")
        tools.append({"type": "function",
                      "function": {k: v for k, v in tool.items() if k != "type"}})
    return tools or None


def chat_tool_choice(choice: str | dict) -> str | dict:
    if isinstance(choice, dict):
        if choice.get("type") != "function":
            raise not_supported(f"tool_choice of type {choice.get('type')!r}")
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def response_format(request: ResponsesRequest) -> dict | None:
    """text.format as the chat response_format (vLLM's extract_structured_outputs)."""
    fmt = (request.text or {}).get("format")
    if not fmt or fmt.get("type") == "text":
        return None
    if request.structured_outputs is not None:
        raise VLLMValidationError("Cannot specify both structured_outputs and text.format",
                                  parameter="structured_outputs")
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {
            "name": fmt.get("name") or "response", "schema": fmt.get("schema"),
            "strict": fmt.get("strict")}}
    return {"type": fmt.get("type")}


def chat_request(request: ResponsesRequest, messages: list[dict]) -> dict:
    """The chat completions request body that serves a Responses request."""
    effort = (request.reasoning or {}).get("effort")
    tools = chat_tools(request)
    return dict(
        messages=messages, model=request.model, max_tokens=request.max_output_tokens,
        temperature=request.temperature, top_p=request.top_p, top_k=request.top_k,
        min_p=request.min_p, presence_penalty=request.presence_penalty,
        frequency_penalty=request.frequency_penalty,
        repetition_penalty=request.repetition_penalty, seed=request.seed, stop=request.stop,
        stop_token_ids=request.stop_token_ids, ignore_eos=request.ignore_eos,
        logit_bias=request.logit_bias, tools=tools,
        tool_choice=chat_tool_choice(request.tool_choice) if tools else "none",
        parallel_tool_calls=request.parallel_tool_calls, reasoning_effort=effort,
        include_reasoning=request.include_reasoning, response_format=response_format(request),
        structured_outputs=request.structured_outputs,
        chat_template_kwargs=request.chat_template_kwargs, cache_salt=request.cache_salt,
        priority=request.priority, skip_special_tokens=request.skip_special_tokens,
        include_stop_str_in_output=request.include_stop_str_in_output,
        vllm_xargs=request.vllm_xargs, logprobs=request.include_logprobs(),
        top_logprobs=request.top_logprobs if request.include_logprobs() else 0,
        truncate_prompt_tokens=-1 if request.truncation == "auto" else None,
        stream=bool(request.stream), stream_options={"include_usage": True}
        if request.stream else None, request_id=request.request_id)
