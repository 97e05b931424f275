"""Engine-level failures, as vllm/v1/engine/exceptions.py (EngineDeadError).

EngineDeadError: the engine can run nothing any more (its loop failed, or the
engine-core process died). As the last event of a request that was in flight it carries
VLLM_ERR_INTERNAL (the OpenAI layer answers 500, as vLLM). A later call (a new request,
metrics, a step) raises its `refusal()`: VLLM_ERR_INTERNAL after a failed step (a bug),
VLLM_ERR_INVALID_STATE after the core process died (the OpenAI layer answers 503).
EngineClosedError: the engine was shut down.
"""

from __future__ import annotations

from libvllm.engine.errors import VllmError

INTERNAL = 9  # VLLM_ERR_INTERNAL
INVALID_STATE = 12  # VLLM_ERR_INVALID_STATE


class EngineDeadError(VllmError):
    """The engine loop failed or its core process died; nothing can run any more."""

    status = INTERNAL

    def __init__(self, message: str, status: int = INTERNAL,
                 refusal_status: int = INTERNAL) -> None:
        super().__init__(message)
        self.status = status
        self.refusal_status = refusal_status

    def refusal(self) -> EngineDeadError:
        """This death as the error of a call made after it."""
        return EngineDeadError(str(self), self.refusal_status, self.refusal_status)


class EngineClosedError(VllmError):
    """The engine was shut down (VLLM_ERR_INVALID_STATE)."""

    status = INVALID_STATE
