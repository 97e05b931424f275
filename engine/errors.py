"""Engine exceptions; each maps to one frozen status code of include/vllm.h.

The C layer (capi/) turns an exception into `VLLM_ERR_*` + the message; the server
maps the same classes to HTTP statuses. Keep codes in sync with vllm.h.
"""


class VllmError(Exception):
    """Base class. `status` is the vllm.h status code."""

    status = 9  # VLLM_ERR_INTERNAL


class InvalidArgumentError(VllmError, ValueError):
    status = 1  # VLLM_ERR_INVALID_ARGUMENT


class ModelLoadError(VllmError):
    """The model path is missing, unreadable, or the file is malformed."""

    status = 3  # VLLM_ERR_MODEL_LOAD


class UnsupportedError(VllmError):
    """Well-formed input the engine does not implement (quant type, architecture)."""

    status = 4  # VLLM_ERR_UNSUPPORTED


class NotFoundError(VllmError, KeyError):
    """Unknown request id or handle."""

    status = 5  # VLLM_ERR_NOT_FOUND

    def __str__(self) -> str:  # KeyError quotes its message; we do not
        return str(self.args[0]) if self.args else ""


class OutOfResourcesError(VllmError):
    """KV cache or memory budget cannot hold what was asked."""

    status = 7  # VLLM_ERR_OUT_OF_RESOURCES
