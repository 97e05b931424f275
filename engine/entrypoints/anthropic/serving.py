"""POST /v1/messages (full and streamed) and POST /v1/messages/count_tokens.

Mirrors vllm/entrypoints/anthropic/serving.py: to_chat_completion_request (system text
blocks joined, billing-header blocks dropped; text / thinking / tool_use / tool_result
blocks -> chat content, reasoning, tool_calls and tool messages; stop_sequences -> stop;
tool_choice auto / any / tool / none -> auto / required / named / none; thinking enabled ->
thinking_token_budget, disabled -> reasoning_effort "none"; output_config.format ->
response_format json_schema, output_config.effort -> reasoning_effort), messages_full_converter
(thinking, text and tool_use blocks; one empty text block for an empty answer),
_to_anthropic_stop_reason and count_tokens. The generation is a chat completion
(engine/entrypoints/openai/serving_chat.py); stream.py converts its chunks.
"""

from __future__ import annotations

import json
import time
import uuid

from libvllm.engine.entrypoints.anthropic.protocol import (
    ContentBlock,
    CountTokensRequest,
    MessagesRequest,
    stop_reason,
    usage,
)
from libvllm.engine.entrypoints.anthropic.stream import stream_events
from libvllm.engine.entrypoints.openai.chat_protocol import ChatCompletionRequest
from libvllm.engine.entrypoints.openai.chat_render import render_prompt
from libvllm.engine.entrypoints.openai.errors import not_supported
from libvllm.engine.entrypoints.openai.serving_chat import ChatJob
from libvllm.engine.entrypoints.openai.serving_engine import ServingContext

_BILLING = "x-anthropic-billing-header"


def _texts(blocks: list[ContentBlock]) -> str:
    return "".join(b.text for b in blocks if b.type == "text" and b.text
                   and not b.text.startswith(_BILLING))


def _tool_result(block: ContentBlock) -> dict:
    content = block.content
    if isinstance(content, list):
        content = "\n".join(item.get("text", "") for item in content
                            if isinstance(item, dict) and item.get("type") == "text")
    return {"role": "tool", "tool_call_id": block.tool_use_id or "", "content": content or ""}


def _message(msg, out: list[dict]) -> None:
    """One Anthropic message as chat messages (tool results become tool messages)."""
    if msg.role == "system":
        text = msg.content if isinstance(msg.content, str) else _texts(msg.content)
        if text and not text.startswith(_BILLING):
            out.append({"role": "system", "content": text})
        return
    if isinstance(msg.content, str):
        out.append({"role": msg.role, "content": msg.content})
        return
    chat: dict = {"role": msg.role}
    parts, calls, reasoning = [], [], []
    for block in msg.content:
        if block.type == "text" and block.text:
            parts.append({"type": "text", "text": block.text})
        elif block.type == "thinking" and block.thinking is not None:
            reasoning.append(block.thinking)
        elif block.type == "tool_use":
            calls.append({"id": block.id or f"call_{int(time.time())}", "type": "function",
                          "function": {"name": block.name or "",
                                       "arguments": json.dumps(block.input or {})}})
        elif block.type == "tool_result":
            if msg.role == "user":
                out.append(_tool_result(block))
            else:
                parts.append({"type": "text", "text": f"Tool result: {block.content or ''}"})
        elif block.type == "image":
            raise not_supported("image content blocks")
    if reasoning:
        chat["reasoning"] = "".join(reasoning)
    if calls:
        chat["tool_calls"] = calls
    if parts:
        chat["content"] = parts[0]["text"] if len(parts) == 1 else parts
    if not (msg.role == "user" and "content" not in chat):
        out.append(chat)


def to_chat_request(request: CountTokensRequest) -> dict:
    """vLLM's to_chat_completion_request, as a chat completions request body."""
    messages: list[dict] = []
    system = request.system if isinstance(request.system, str) or request.system is None \
        else _texts(request.system)
    if system:
        messages.append({"role": "system", "content": system})
    for msg in request.messages:
        _message(msg, messages)
    chat: dict = {"model": request.model, "messages": messages,
                  "chat_template_kwargs": request.chat_template_kwargs}
    if isinstance(request, MessagesRequest):
        chat.update(max_tokens=request.max_tokens, stop=request.stop_sequences or [],
                    temperature=request.temperature, top_p=request.top_p,
                    top_k=request.top_k, cache_salt=request.cache_salt,
                    vllm_xargs=request.vllm_xargs)
        if request.stream:
            chat.update(stream=True, stream_options={"include_usage": True,
                                                     "continuous_usage_stats": True})
    config = request.output_config
    if config is not None and config.format is not None and config.format.json_schema:
        chat["response_format"] = {"type": "json_schema", "json_schema": {
            "schema": config.format.json_schema, "name": config.format.type}}
    if config is not None and config.effort is not None:
        chat["reasoning_effort"] = config.effort
    if request.thinking is not None and request.thinking.type == "disabled":
        chat["reasoning_effort"] = "none"
    elif request.thinking is not None and request.thinking.type == "enabled":
        chat["thinking_token_budget"] = request.thinking.budget_tokens
    choice = request.tool_choice
    if choice is not None:
        chat["parallel_tool_calls"] = not choice.disable_parallel_tool_use
        chat["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}.get(
            choice.type) or {"type": "function", "function": {"name": choice.name}}
    if request.tools is not None:
        chat["tools"] = [{"type": "function", "function": {
            "name": t.name, "description": t.description, "parameters": t.input_schema,
            "strict": t.strict}} for t in request.tools]
        chat.setdefault("tool_choice", "auto")
    return chat


def content_blocks(message: dict) -> list[dict]:
    """A chat message as thinking, text and tool_use blocks (messages_full_converter);
    an empty answer is one empty text block, as Anthropic's API answers."""
    content: list[dict] = []
    if message.get("reasoning"):
        content.append({"type": "thinking", "thinking": message["reasoning"],
                        "signature": uuid.uuid4().hex})
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    content += [{"type": "tool_use", "id": c["id"], "name": c["function"]["name"],
                 "input": json.loads(c["function"]["arguments"])}
                for c in message.get("tool_calls") or ()]
    return content or [{"type": "text", "text": ""}]


class MessagesJob:
    """One /v1/messages request, generating as a chat completion."""

    def __init__(self, ctx: ServingContext, request: MessagesRequest) -> None:
        chat = ChatCompletionRequest.model_validate(to_chat_request(request))
        self.chat = ChatJob(ctx, chat)
        self.merged = self.chat.merged

    def response(self) -> str:
        data = json.loads(self.chat.response())
        choice = data["choices"][0]
        message, calls = choice["message"], choice["message"].get("tool_calls") or []
        reason, sequence = stop_reason(choice["finish_reason"], choice.get("stop_reason"),
                                       bool(calls), bool(calls))
        return json.dumps({
            "id": data["id"], "type": "message", "role": "assistant",
            "content": content_blocks(message), "model": data["model"],
            "stop_reason": reason, "stop_sequence": sequence, "usage": usage(data["usage"])})

    def chunks(self, clock):
        return stream_events(self.chat.chunks(clock))


def count_tokens(ctx: ServingContext, request: CountTokensRequest) -> str:
    """The prompt's token count, rendered as a generation would be."""
    chat = ChatCompletionRequest.model_validate(to_chat_request(request))
    ctx.check_model(chat.model)
    tok = ctx.tokenizer("count_tokens requests")
    with ctx.client.lock:
        text = render_prompt(ctx.client.engine, chat)
    n = len(tok.encode(text, add_special_tokens=chat.add_special_tokens))
    return json.dumps({"input_tokens": n, "context_management": {"original_input_tokens": n}})
