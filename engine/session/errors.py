"""The errors an EngineSession raises beyond engine.errors / engine.exceptions.

InvalidStateError: the call is not allowed in the session's current state (a
caller-driven step while the background loop runs, tokenizing without a tokenizer, a
prefix-cache reset while requests hold blocks); include/vllm.h's VLLM_ERR_INVALID_STATE.
vLLM raises RuntimeError / ValueError for these in vllm/entrypoints/llm.py; the session
gives them one class so every front end maps them to one status.
"""

from __future__ import annotations

from libvllm.engine.errors import VllmError
from libvllm.engine.exceptions import INVALID_STATE


class InvalidStateError(VllmError):
    """Not allowed now (VLLM_ERR_INVALID_STATE)."""

    status = INVALID_STATE
