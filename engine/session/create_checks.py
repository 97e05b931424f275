"""What an engine session refuses before it loads anything, and the chat template it
is given (include/vllm.h vllm_engine_params.chat_template, vLLM's --chat-template).

vLLM fails at start-up, not at the first request: a model path that is neither a file
nor a directory (/dev/null, a FIFO) is a ModelLoadError, and a chat template that does
not compile is an InvalidArgumentError with the template's syntax error
(vllm/renderers/chat_utils/chat_template.py resolves and loads it when the server
starts: a file's text, else the value itself when it looks like a template).
"""

from __future__ import annotations

import os
import stat

from libvllm.engine.chat_template import check_chat_template
from libvllm.engine.errors import InvalidArgumentError, ModelLoadError


def load_chat_template(value: str) -> str:
    """vLLM's --chat-template: a file's text, else the value itself when it looks like
    a template (holds "{", "}" or a newline)."""
    try:
        with open(value, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        if not any(c in value for c in "{}\n"):
            raise InvalidArgumentError(
                f"The supplied chat template ({value}) looks like a file path, but it failed "
                f"to be opened. Tried: {value}. Reason: {e}") from None
        return value


def check_create_inputs(model_path: str, chat_template: str | None) -> None:
    try:
        mode = os.stat(model_path).st_mode
    except OSError:
        mode = None  # missing or unreadable: the loader says which
    if mode is not None and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise ModelLoadError(f"model path {model_path} is neither a file nor a directory")
    if chat_template is not None:
        check_chat_template(chat_template)
