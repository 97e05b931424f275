"""EngineCoreClient: how the front end talks to the engine core, as
vllm/v1/engine/core_client.py (EngineCoreClient, InprocClient; the multiprocess
SyncMPClient is engine/engine_core/core_client_mp.py, the choice between them
engine/engine_core/client_factory.py).

Every client has the same surface: `ready` (what the core reported at start-up),
add_request, abort_requests, get_output (one step's EngineCoreOutputs), the utility calls
make_stats and reset_prefix_cache, wakeup and shutdown. The in-process client runs a
core step inside get_output; callers serialize its use (LLMEngine's owner holds a lock).
Mode selection (vLLM's VLLM_ENABLE_V1_MULTIPROCESSING) is `use_multiprocessing`. The
front end of a child core imports no torch (.agents/specs/torch-free-front-end.md): the
in-process client's core and the mode's device check (engine/platforms.py) are imported
or run only where needed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from libvllm.engine import envs, platforms
from libvllm.engine.config import EngineConfig
from libvllm.engine.engine_core.engine_core_messages import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreReady,
    EngineCoreRequest,
)

if TYPE_CHECKING:
    from libvllm.engine.engine_core.engine_core import EngineCore


def use_multiprocessing(config: EngineConfig) -> bool:
    """config.multiprocessing if set, else VLLM_ENABLE_V1_MULTIPROCESSING if set, else
    on with CUDA and off on CPU (measured equal on CPU, where the child only costs a
    second torch import and weights copy: docs/architecture.md, "Process model"). The
    device here is config.device, "auto" being CUDA when NVML reports a GPU."""
    if config.multiprocessing is not None:
        return config.multiprocessing
    env = envs.VLLM_ENABLE_V1_MULTIPROCESSING
    if env is not None:
        return env
    if config.device == "auto":
        return platforms.cuda_platform_available()
    return config.device == "cuda"


class EngineCoreClient:
    """The client interface (vLLM's abstract EngineCoreClient)."""

    ready: EngineCoreReady
    is_multiprocess = False

    def add_request(self, request: EngineCoreRequest) -> None:
        raise NotImplementedError

    def abort_requests(self, request_ids: list[str]) -> None:
        raise NotImplementedError

    def get_output(self, timeout_s: float | None = None) -> EngineCoreOutputs | None:
        """The next step's outputs; None if nothing came within timeout_s (or wakeup)."""
        raise NotImplementedError

    def has_work(self) -> bool:
        """Whether get_output must still be called for the core's own sake (in process:
        steps still queued on the device)."""
        return False

    def make_stats(self) -> EngineCoreOutputs:
        raise NotImplementedError

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        raise NotImplementedError

    def peak_memory_bytes(self) -> int:
        raise NotImplementedError

    def wakeup(self) -> None:
        """Make a blocked get_output return (None) now."""

    def check_health(self) -> None:
        """Raises EngineDeadError once the core can run nothing any more; never waits.
        In process the core runs on its caller's thread, whose failures reach that caller."""

    def shutdown(self) -> None:
        raise NotImplementedError


class InprocClient(EngineCoreClient):
    """The core in the caller's process: get_output runs one core step."""

    def __init__(self, engine_core: EngineCore) -> None:
        self.engine_core = engine_core
        self.ready = engine_core.ready
        self._refused: list[EngineCoreOutput] = []  # add_request's error outputs

    def add_request(self, request: EngineCoreRequest) -> None:
        refused = self.engine_core.add_request(request)
        if refused is not None:
            self._refused.append(refused)

    def abort_requests(self, request_ids: list[str]) -> None:
        self.engine_core.abort_requests(request_ids)

    def get_output(self, timeout_s: float | None = None) -> EngineCoreOutputs:
        outputs = self.engine_core.step()
        if self._refused:
            outputs.outputs = [*self._refused, *outputs.outputs]
            self._refused = []
        return outputs

    def has_work(self) -> bool:
        return bool(self._refused) or self.engine_core.has_work()

    def make_stats(self) -> EngineCoreOutputs:
        return self.engine_core.make_stats()

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        return self.engine_core.reset_prefix_cache(reset_running_requests)

    def peak_memory_bytes(self) -> int:
        return self.engine_core.peak_memory_bytes()

    def shutdown(self) -> None:
        self.engine_core.shutdown()
