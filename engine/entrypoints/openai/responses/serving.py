"""POST /v1/responses (full and streamed), GET /v1/responses/{id}, POST .../{id}/cancel.

Mirrors vllm/entrypoints/openai/responses/serving.py (the non-harmony SimpleContext path):
_validate_create_responses_input and the store rules of _create_responses,
responses_full_generator (status "incomplete" on finish_reason length, usage with
reasoning tokens), responses_stream_generator (response.created, response.in_progress,
the item events of stream.py, then response.completed or response.incomplete, numbered by
sequence_number from 0), retrieve_responses, cancel_responses and _make_not_found_error.
The generation itself is a chat completion (engine/entrypoints/openai/serving_chat.py):
its template, tool and reasoning parsers and structured output.
"""

from __future__ import annotations

import json
import time

from libvllm.engine.entrypoints.openai.chat_protocol import ChatCompletionRequest
from libvllm.engine.entrypoints.openai.errors import (
    VLLMNotFoundError,
    VLLMValidationError,
    error_response,
    not_supported,
)
from libvllm.engine.entrypoints.openai.protocol import random_uuid
from libvllm.engine.entrypoints.openai.responses.protocol import (
    ResponsesRequest,
    chat_request,
    input_messages,
)
from libvllm.engine.entrypoints.openai.responses.store import ResponseStore
from libvllm.engine.entrypoints.openai.responses.stream import ResponseEvents, item_status
from libvllm.engine.entrypoints.openai.serving_chat import ChatJob
from libvllm.engine.entrypoints.openai.serving_engine import ServingContext
from libvllm.engine.sampling_params import SamplingParams

_NO_STORE = ("This vLLM engine does not support `store=True` and therefore does not support "
             "the background mode. To enable these features, set the environment variable "
             "`VLLM_ENABLE_RESPONSES_API_STORE=1` when launching the vLLM server.")


def not_found(response_id: str) -> VLLMNotFoundError:
    return VLLMNotFoundError(f"Response with id '{response_id}' not found.",
                             parameter="response_id")


def _usage(chat_usage: dict | None) -> dict | None:
    if chat_usage is None:
        return None
    details = chat_usage.get("completion_tokens_details") or {}
    return {"input_tokens": chat_usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": chat_usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": details.get("reasoning_tokens") or 0},
            "total_tokens": chat_usage["total_tokens"]}


def output_items(message: dict, logprobs: dict | None, finish_reason: str | None) -> list:
    """vLLM's build_response_output_items: reasoning, message, function calls."""
    items: list[dict] = []
    last = item_status(finish_reason)
    calls = message.get("tool_calls") or []
    if message.get("reasoning"):
        items.append({"id": f"rs_{random_uuid()}", "summary": [], "type": "reasoning",
                      "content": [{"text": message["reasoning"], "type": "reasoning_text"}],
                      "status": None})
    if message.get("content"):
        items.append({"id": f"msg_{random_uuid()}", "content": [{
            "text": message["content"], "annotations": [], "type": "output_text",
            "logprobs": (logprobs or {}).get("content")}], "role": "assistant",
            "status": "completed" if calls else last, "type": "message"})
    for i, call in enumerate(calls):
        items.append({"id": f"fc_{random_uuid()}", "call_id": call.get("id"),
                      "type": "function_call",
                      "status": last if i == len(calls) - 1 else "completed",
                      "name": call["function"]["name"],
                      "arguments": call["function"]["arguments"]})
    return items


class ResponsesJob:
    """One /v1/responses request, generating as a chat completion."""

    def __init__(self, ctx: ServingContext, request: ResponsesRequest,
                 store: ResponseStore) -> None:
        ctx.check_model(request.model)
        if request.background:
            raise VLLMValidationError(_NO_STORE, parameter="background") \
                if not store.enabled else not_supported("background")
        if request.previous_input_messages and request.previous_response_id:
            raise VLLMValidationError("Only one of `previous_input_messages` and "
                                      "`previous_response_id` can be set.",
                                      parameter="previous_response_id")
        if request.previous_input_messages:
            raise not_supported("previous_input_messages")
        request.store = bool(request.store) and store.enabled  # vLLM ignores it when off
        prev_messages = prev_output = None
        if request.previous_response_id is not None:
            found = store.get(request.previous_response_id) if store.enabled else None
            if found is None:
                raise not_found(request.previous_response_id)
            prev_output, prev_messages = found[0]["output"], found[1]
        ctx.check_output_budget(request.max_output_tokens, "max_output_tokens")
        self.ctx, self.request, self.store = ctx, request, store
        self.messages = input_messages(request, prev_messages, prev_output)
        chat = ChatCompletionRequest.model_validate(chat_request(request, self.messages))
        self.chat = ChatJob(ctx, chat)
        self.merged = self.chat.merged
        self.created = int(time.time())
        defaults = ctx.default_sampling
        self.sampling = {
            "temperature": defaults.get("temperature", SamplingParams.temperature)
            if request.temperature is None else request.temperature,
            "top_p": defaults.get("top_p", SamplingParams.top_p) if request.top_p is None
            else request.top_p,
            "max_output_tokens": ctx.get_max_tokens(request.max_output_tokens,
                                                    len(self.chat.prompt_ids))}

    def _response(self, status: str, output: list, usage: dict | None) -> dict:
        """vLLM's ResponsesResponse.from_request."""
        req = self.request
        return {
            "id": req.request_id, "created_at": self.created,
            "incomplete_details": {"reason": "max_output_tokens"}
            if status == "incomplete" else None,
            "instructions": req.instructions, "metadata": req.metadata,
            "model": self.ctx.served_model_name, "object": "response", "output": output,
            "parallel_tool_calls": True if req.parallel_tool_calls is None
            else req.parallel_tool_calls,
            "temperature": self.sampling["temperature"], "tool_choice": req.tool_choice,
            "tools": req.tools, "top_p": self.sampling["top_p"], "background": False,
            "max_output_tokens": self.sampling["max_output_tokens"],
            "max_tool_calls": req.max_tool_calls,
            "previous_response_id": req.previous_response_id, "reasoning": req.reasoning,
            "service_tier": req.service_tier, "status": status, "text": req.text,
            "top_logprobs": req.top_logprobs if req.include_logprobs() else None,
            "truncation": req.truncation or "disabled", "usage": usage, "user": req.user}

    def _finish(self, response: dict) -> dict:
        if self.request.store:
            self.store.put(response, self.messages)
        return response

    def response(self) -> str:
        data = json.loads(self.chat.response())
        choice = data["choices"][0]
        status = "incomplete" if choice["finish_reason"] == "length" else "completed"
        output = output_items(choice["message"], choice.get("logprobs"),
                              choice["finish_reason"])
        return json.dumps(self._finish(self._response(status, output, _usage(data["usage"]))))

    def chunks(self, clock):
        """Yields event JSON, or None when the clock ran out before the next event."""
        seq = 0

        def numbered(event: dict) -> str:
            nonlocal seq
            event["sequence_number"], seq = seq, seq + 1
            return json.dumps(event)

        initial = self._response("in_progress", [], None)
        yield numbered({"type": "response.created", "response": initial})
        yield numbered({"type": "response.in_progress", "response": initial})
        events, finish, usage = ResponseEvents(), None, None
        try:
            for text in self.chat.chunks(clock):
                if text is None:
                    yield None
                    continue
                chunk = json.loads(text)
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices") or ():
                    finish = choice.get("finish_reason") or finish
                    logprobs = (choice.get("logprobs") or {}).get("content")
                    for event in events.feed(choice.get("delta") or {}, logprobs):
                        yield numbered(event)
        except Exception as exc:  # noqa: BLE001 - the stream's error event, as vLLM's
            yield numbered(error_event(exc))
            return
        for event in events.close(item_status(finish)):
            yield numbered(event)
        status = "incomplete" if finish == "length" else "completed"
        final = self._finish(self._response(status, events.output_items, _usage(usage)))
        yield numbered({"type": f"response.{status}", "response": final})


def error_event(exc: BaseException) -> dict:
    """A failure after the stream started: the Responses API's error event (numbered by
    the caller)."""
    error = error_response(exc)[1]["error"]
    return {"type": "error", "code": error["type"], "message": error["message"],
            "param": error["param"]}


def retrieve_response(store: ResponseStore, response_id: str) -> str:
    found = store.get(response_id) if store.enabled else None
    if found is None:
        raise not_found(response_id)
    return json.dumps(found[0])


def cancel_response(store: ResponseStore, response_id: str) -> str:
    """Only a background response can be cancelled; stored ones are complete."""
    found = store.get(response_id) if store.enabled else None
    if found is None:
        raise not_found(response_id)
    if found[0]["status"] not in ("queued", "in_progress"):
        raise VLLMValidationError("Cannot cancel a synchronous response.",
                                  parameter="response_id")
    return json.dumps(found[0])

