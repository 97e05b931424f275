"""capi.create_checks: what vllm_engine_create refuses before it loads anything.

vLLM fails at start-up, not at the first request: a model path that is neither a file
nor a directory (/dev/null, a FIFO) is VLLM_ERR_MODEL_LOAD, and a chat template
(params->chat_template) that does not compile is VLLM_ERR_INVALID_ARGUMENT with the
template's syntax error (vllm/renderers/chat_utils/chat_template.py resolves and loads it
when the server starts).
"""

from __future__ import annotations

import os
import stat

from engine.chat_template import check_chat_template
from engine.errors import ModelLoadError


def check_create_inputs(model_path: str, chat_template: str | None) -> None:
    try:
        mode = os.stat(model_path).st_mode
    except OSError:
        mode = None  # missing or unreadable: the loader says which
    if mode is not None and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise ModelLoadError(f"model path {model_path} is neither a file nor a directory")
    if chat_template is not None:
        check_chat_template(chat_template)
