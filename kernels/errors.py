"""The status-carrying exceptions a kernel launcher raises; engine/errors.py re-exports them.

kernels/ sits below engine/, so the root of the error hierarchy lives here: VllmError
(`status` is the include/vllm.h code), InvalidArgumentError (a launcher's bad argument,
VLLM_ERR_INVALID_ARGUMENT) and UnsupportedError (a GGML type without a kernel,
VLLM_ERR_UNSUPPORTED). engine/errors.py imports these very classes and adds the rest, so a
kernel's error is the engine's: capi/plumbing.py's `except VllmError` gives its status,
the OpenAI layer's InvalidArgumentError / UnsupportedError checks map it to HTTP 400 / 501,
and no import runs upward. This module imports nothing (engine/errors.py loads it early).
"""


class VllmError(Exception):
    """Base class. `status` is the vllm.h status code."""

    status = 9  # VLLM_ERR_INTERNAL


class InvalidArgumentError(VllmError, ValueError):
    status = 1  # VLLM_ERR_INVALID_ARGUMENT


class UnsupportedError(VllmError):
    """Well-formed input the engine does not implement (quant type, architecture)."""

    status = 4  # VLLM_ERR_UNSUPPORTED
