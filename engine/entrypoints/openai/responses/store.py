"""The in-memory store of /v1/responses: stored responses and their input messages, for
previous_response_id, GET /v1/responses/{id} and POST /v1/responses/{id}/cancel.

Mirrors response_store / msg_store of vllm/entrypoints/openai/responses/serving.py: off
unless VLLM_ENABLE_RESPONSES_API_STORE is set (then `store` defaults to true, as OpenAI's
API; off, `store=true` is silently ignored, as vLLM does). vLLM's dicts never forget; this
one is an LRU bounded by VLLM_RESPONSES_API_STORE_MAX_ENTRIES entries and
VLLM_RESPONSES_API_STORE_MAX_BYTES bytes of JSON (the least recently used entry goes first).
The environment is read in one place: store_for, once per engine client.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections import OrderedDict

from libvllm.engine import envs

MAX_ENTRIES_ENV = "VLLM_RESPONSES_API_STORE_MAX_ENTRIES"
MAX_BYTES_ENV = "VLLM_RESPONSES_API_STORE_MAX_BYTES"
DEFAULT_MAX_ENTRIES = 1024
DEFAULT_MAX_BYTES = 64 << 20


class ResponseStore:
    """id -> (response JSON text, input messages JSON text); thread-safe."""

    def __init__(self, enabled: bool, max_entries: int = DEFAULT_MAX_ENTRIES,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise ValueError(f"{MAX_ENTRIES_ENV} and {MAX_BYTES_ENV} must be positive")
        self.enabled, self.max_entries, self.max_bytes = enabled, max_entries, max_bytes
        self._entries: OrderedDict[str, tuple[str, str]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, response: dict, messages: list[dict]) -> None:
        """Stores (or replaces) a response; an entry larger than the byte cap is not kept."""
        entry = (json.dumps(response), json.dumps(messages))
        size = len(entry[0]) + len(entry[1])
        with self._lock:
            self._drop(response["id"])
            if size > self.max_bytes:
                return
            self._entries[response["id"]] = entry
            self._bytes += size
            while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
                self._drop(next(iter(self._entries)))

    def get(self, response_id: str) -> tuple[dict, list[dict]] | None:
        """The stored response and its input messages (a fresh copy), or None."""
        with self._lock:
            entry = self._entries.get(response_id)
            if entry is None:
                return None
            self._entries.move_to_end(response_id)
        return json.loads(entry[0]), json.loads(entry[1])

    def stats(self) -> tuple[int, int]:
        """(entries, bytes) held now."""
        with self._lock:
            return len(self._entries), self._bytes

    def _drop(self, response_id: str) -> None:
        entry = self._entries.pop(response_id, None)
        if entry is not None:
            self._bytes -= len(entry[0]) + len(entry[1])


_stores: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_stores_lock = threading.Lock()


def store_for(client) -> ResponseStore:
    """The store of one engine client, made from the environment on first use."""
    with _stores_lock:
        store = _stores.get(client)
        if store is None:
            store = ResponseStore(envs.VLLM_ENABLE_RESPONSES_API_STORE,
                                  envs.VLLM_RESPONSES_API_STORE_MAX_ENTRIES,
                                  envs.VLLM_RESPONSES_API_STORE_MAX_BYTES)
            _stores[client] = store
        return store
