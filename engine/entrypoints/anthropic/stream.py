"""The streamed /v1/messages events, built from the chunks of a streamed chat completion.

Mirrors message_stream_converter of vllm/entrypoints/anthropic/serving.py: message_start
on the first chunk; one content block at a time (thinking, text, tool_use), opened by
content_block_start, filled by content_block_delta (thinking_delta, text_delta,
input_json_delta), closed by content_block_stop (a thinking block sends its
signature_delta first); text that arrives inside a tool_use block is held and sent as a
text block after it; the usage chunk closes the last block and sends message_delta with
stop_reason and usage; message_stop ends the stream. A failure becomes an `error` event.
vLLM sends no ping event and no [DONE].
"""

from __future__ import annotations

import json
import uuid

from libvllm.engine.entrypoints.anthropic.protocol import error_body, stop_reason, usage


class _Blocks:
    """The open content block and the events that open, fill and close blocks."""

    def __init__(self) -> None:
        self.next_index = 0
        self.kind: str | None = None
        self.signature: str | None = None
        self.tool_id: str | None = None
        self.pending: list[str] = []

    def start(self, block: dict) -> str:
        self.kind = block["type"]
        self.signature = uuid.uuid4().hex if self.kind == "thinking" else None
        self.tool_id = block.get("id")
        return _event("content_block_start", index=self.next_index, content_block=block)

    def delta(self, **delta) -> str:
        return _event("content_block_delta", index=self.next_index, delta=delta)

    def stop(self) -> list[str]:
        if self.kind is None:
            return []
        events = [self.delta(type="signature_delta", signature=self.signature)] \
            if self.signature else []
        events.append(_event("content_block_stop", index=self.next_index))
        self.kind, self.signature, self.tool_id = None, None, None
        self.next_index += 1
        return events

    def stop_and_flush(self) -> list[str]:
        """Closes the open block; text held back during a tool_use block follows it."""
        held, self.pending = "".join(self.pending), []
        events = self.stop()
        if held:
            events += [self.start({"type": "text", "text": ""}),
                       self.delta(type="text_delta", text=held)] + self.stop()
        return events


def _event(kind: str, **fields) -> str:
    return json.dumps({"type": kind, **fields})


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def stream_events(chunks):
    """Yields Anthropic event JSON (None when the clock ran out) from chat chunk JSON."""
    blocks = _Blocks()
    first, finish, stop_seq, tool_used, last_args = True, None, None, False, []
    ids: dict[int, str] = {}
    try:
        for text in chunks:
            if text is None:
                yield None
                continue
            chunk = json.loads(text)
            if first:
                first = False
                yield _event("message_start", message={
                    "id": chunk["id"], "type": "message", "role": "assistant", "content": [],
                    "model": chunk["model"], "stop_reason": None, "stop_sequence": None,
                    "usage": usage(chunk.get("usage"))})
                continue
            if not chunk["choices"]:  # the usage chunk
                yield from blocks.stop_and_flush()
                reason, sequence = stop_reason(finish or "stop", stop_seq, tool_used,
                                               tool_used and _is_json("".join(last_args)))
                yield _event("message_delta", delta={"stop_reason": reason,
                                                     "stop_sequence": sequence},
                             usage=usage(chunk.get("usage")))
                continue
            choice = chunk["choices"][0]
            if choice.get("finish_reason") is not None:
                finish, stop_seq = choice["finish_reason"], choice.get("stop_reason")
            delta = choice.get("delta") or {}
            if delta.get("reasoning"):
                if blocks.kind != "thinking":
                    yield from blocks.stop_and_flush()
                    yield blocks.start({"type": "thinking", "thinking": ""})
                yield blocks.delta(type="thinking_delta", thinking=delta["reasoning"])
            if delta.get("content"):
                if blocks.kind == "tool_use":
                    blocks.pending.append(delta["content"])
                else:
                    if blocks.kind != "text":
                        yield from blocks.stop_and_flush()
                        yield blocks.start({"type": "text", "text": ""})
                    yield blocks.delta(type="text_delta", text=delta["content"])
            for call in delta.get("tool_calls") or ():
                function = call.get("function") or {}
                if call.get("id") is not None:
                    ids[call["index"]] = call["id"]
                    if blocks.tool_id != call["id"] and function.get("name") is not None:
                        yield from blocks.stop_and_flush()
                        tool_used, last_args = True, []
                        yield blocks.start({"type": "tool_use", "id": call["id"],
                                            "name": function["name"], "input": {}})
                call_id = call.get("id") or ids.get(call.get("index"))
                if function.get("arguments") and call_id is not None \
                        and blocks.tool_id == call_id:
                    last_args.append(function["arguments"])
                    yield blocks.delta(type="input_json_delta",
                                       partial_json=function["arguments"])
        yield from blocks.stop_and_flush()
        yield _event("message_stop")
    except Exception as exc:  # noqa: BLE001 - the stream's error event, as vLLM's
        yield from blocks.stop()
        yield json.dumps(error_body(exc)[1])
