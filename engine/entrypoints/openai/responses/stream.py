"""The streamed /v1/responses events, built from the deltas of a streamed chat completion.

Mirrors SimpleStreamingEventProcessor and the emit_simple_* functions of
vllm/entrypoints/openai/responses/streaming_events.py: each delta is split into reasoning,
content and tool-call parts (split_delta); a part of another kind than the open output item
closes it (its *.done events, then response.output_item.done) and opens the next
(response.output_item.added, and response.content_part.added for a message or reasoning);
the part itself is a response.output_text.delta, response.reasoning_text.delta or
response.function_call_arguments.delta. Events are dicts with "type" first; the caller
numbers them (sequence_number).
"""

from __future__ import annotations

from libvllm.engine.entrypoints.openai.protocol import random_uuid

_NONE, _CONTENT, _REASONING, _TOOL = "none", "content", "reasoning", "tool_call"


def item_status(finish_reason: str | None) -> str:
    """vLLM's response_item_status: the status of the item that ended the generation."""
    return "incomplete" if finish_reason == "length" else "completed"


def split_delta(delta: dict) -> list[dict]:
    """A chat delta as atomic parts: reasoning, then content, then tool calls by index."""
    parts = []
    if delta.get("reasoning") is not None:
        parts.append({"reasoning": delta["reasoning"]})
    if delta.get("content") is not None:
        parts.append({"content": delta["content"]})
    groups: dict = {}
    for call in delta.get("tool_calls") or ():
        groups.setdefault(call.get("index"), []).append(call)
    parts.extend({"tool_calls": calls} for calls in groups.values())
    return parts


class ResponseEvents:
    """The state machine of one streamed response; output_items: the items done so far."""

    def __init__(self) -> None:
        self.output_index = 0
        self.state = _NONE
        self.item_id = ""
        self.text = ""
        self.logprobs: list = []
        self.call: dict = {}
        self.output_items: list[dict] = []

    def feed(self, delta: dict, logprobs: list | None) -> list[dict]:
        """The events of one chat delta (its logprobs: the content's, chat's shape)."""
        events: list[dict] = []
        for part in split_delta(delta):
            target, call = self._target(part)
            if target == _NONE:
                continue
            if self.state != target or (target == _TOOL and call.get("index") is not None
                                        and call.get("index") != self.call.get("index")):
                events += self.close()
                events += self._open(target, call)
            events += self._delta(part, logprobs)
        return events

    @staticmethod
    def _target(part: dict) -> tuple[str, dict]:
        calls = part.get("tool_calls")
        if calls and calls[0].get("function") is not None:
            return _TOOL, calls[0]
        if part.get("reasoning") is not None:
            return _REASONING, {}
        return (_CONTENT, {}) if part.get("content") else (_NONE, {})

    def _where(self, **fields) -> dict:
        return {"output_index": self.output_index, "item_id": self.item_id, **fields}

    def _open(self, target: str, call: dict) -> list[dict]:
        self.state, self.text, self.logprobs = target, "", []
        if target == _TOOL:
            self.item_id = f"fc_{random_uuid()}"
            self.call = {"index": call.get("index"),
                         "call_id": call.get("id") or f"call_{random_uuid()}",
                         "name": (call.get("function") or {}).get("name") or ""}
            return [{"type": "response.output_item.added", "output_index": self.output_index,
                     "item": self._call_item("", "in_progress")}]
        if target == _CONTENT:
            self.item_id = f"msg_{random_uuid()}"
            item = {"id": self.item_id, "type": "message", "role": "assistant", "content": [],
                    "status": "in_progress"}
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        else:
            self.item_id = f"rs_{random_uuid()}"
            item = {"type": "reasoning", "id": self.item_id, "summary": [],
                    "status": "in_progress"}
            part = {"text": "", "type": "reasoning_text"}
        return [{"type": "response.output_item.added", "output_index": self.output_index,
                 "item": item},
                {"type": "response.content_part.added",
                 **self._where(content_index=0, part=part)}]

    def _call_item(self, arguments: str, status: str) -> dict:
        return {"type": "function_call", "id": self.item_id, "call_id": self.call["call_id"],
                "name": self.call["name"], "arguments": arguments, "status": status}

    def _delta(self, part: dict, logprobs: list | None) -> list[dict]:
        if self.state == _TOOL:
            args = "".join((c.get("function") or {}).get("arguments") or ""
                           for c in part["tool_calls"])
            self.text += args
            return [{"type": "response.function_call_arguments.delta",
                     **self._where(delta=args)}] if args else []
        if self.state == _REASONING:
            self.text += part["reasoning"]
            return [{"type": "response.reasoning_text.delta",
                     **self._where(content_index=0, delta=part["reasoning"])}]
        self.text += part["content"]
        self.logprobs += logprobs or []
        return [{"type": "response.output_text.delta",
                 **self._where(content_index=0, delta=part["content"],
                               logprobs=logprobs or [])}]

    def close(self, status: str = "completed") -> list[dict]:
        """The done events of the open item (none when no item is open)."""
        if self.state == _NONE:
            return []
        if self.state == _TOOL:
            item = self._call_item(self.text, status)
            events = [{"type": "response.function_call_arguments.done",
                       **self._where(arguments=self.text, name=self.call["name"])}]
        elif self.state == _CONTENT:
            part = {"type": "output_text", "text": self.text, "annotations": [],
                    "logprobs": self.logprobs or None}
            item = {"id": self.item_id, "type": "message", "role": "assistant",
                    "content": [part] if self.text else [], "status": status}
            events = [{"type": "response.output_text.done",
                       **self._where(content_index=0, text=self.text, logprobs=[])},
                      {"type": "response.content_part.done",
                       **self._where(content_index=0, part=part)}]
        else:
            part = {"text": self.text, "type": "reasoning_text"}
            item = {"type": "reasoning", "content": [part], "status": status,
                    "id": self.item_id, "summary": []}
            events = [{"type": "response.reasoning_text.done",
                       **self._where(content_index=0, text=self.text)},
                      {"type": "response.content_part.done",
                       **self._where(content_index=0, part=part)}]
        events.append({"type": "response.output_item.done", "output_index": self.output_index,
                       "item": item})
        self.output_items.append(item)
        self.output_index += 1
        self.state = _NONE
        return events
