"""Engine exceptions; each maps to one frozen status code of include/vllm.h.

The C layer (capi/) turns an exception into `VLLM_ERR_*` + the message; the server
maps the same classes to HTTP statuses. Keep codes in sync with vllm.h.

VllmError, InvalidArgumentError and UnsupportedError are defined in kernels/errors.py (the
bottom layer, whose launchers raise them) and re-exported here unchanged: one class each,
so a kernel's error maps to the same status as the engine's.
"""

from libvllm.kernels.errors import InvalidArgumentError, UnsupportedError, VllmError

__all__ = ["InvalidArgumentError", "ModelLoadError", "NotFoundError", "OutOfResourcesError",
           "UnsupportedError", "VllmError"]


class ModelLoadError(VllmError):
    """The model path is missing, unreadable, or the file is malformed."""

    status = 3  # VLLM_ERR_MODEL_LOAD


class NotFoundError(VllmError, KeyError):
    """Unknown request id or handle."""

    status = 5  # VLLM_ERR_NOT_FOUND

    def __str__(self) -> str:  # KeyError quotes its message; we do not
        return str(self.args[0]) if self.args else ""


class OutOfResourcesError(VllmError):
    """KV cache or memory budget cannot hold what was asked."""

    status = 7  # VLLM_ERR_OUT_OF_RESOURCES
