"""capi.engine_state: vllm_engine_check_health and vllm_engine_reset_prefix_cache (since
ABI 1.3).

Health mirrors vllm/v1/engine/async_llm.py (AsyncLLM.check_health: raise the dead error
once the engine errored) and vllm/entrypoints/serve/instrumentator/health.py (an
EngineDeadError is "unhealthy", 503; any other error propagates). The engine's own
check_health (the background loop's AsyncLLM, then the LLMEngine over its core client)
is called where it exists; without it, the error state the loop and the multiprocess
client already keep (AsyncLLM._dead, SyncMPClient.dead) decides. Neither path takes the
engine record's lock: a health check never waits for a running step.

reset_prefix_cache mirrors vllm/v1/engine/llm_engine.py (LLMEngine.reset_prefix_cache ->
EngineCoreClient.reset_prefix_cache, a utility call to a child core) and
vllm/v1/core/block_pool.py (False while blocks are in use), False becoming
VLLM_ERR_INVALID_STATE.
"""

from __future__ import annotations

from _libvllm import lib

from capi.plumbing import InvalidStateError, engines, export
from engine.errors import VllmError
from engine.exceptions import EngineDeadError


class EngineDeadStatus(VllmError):
    status = lib.VLLM_ERR_ENGINE_DEAD


def _known_death(target) -> EngineDeadError | None:
    """The error state kept by an AsyncLLM (_dead) or by an LLMEngine's multiprocess
    core client (dead); None: no error recorded (an in-process core)."""
    dead = getattr(target, "_dead", None)
    if dead is None:
        dead = getattr(getattr(target, "engine_core", None), "dead", None)
    return dead


def _check(target) -> None:
    check = getattr(target, "check_health", None)
    if check is not None:
        check()
        return
    dead = _known_death(target)
    if dead is not None:
        raise dead


@export
def glue_engine_check_health(key) -> None:
    record = engines.get_live(key)
    try:
        for target in (record.loop, record.engine):
            if target is not None:
                _check(target)
    except EngineDeadError as e:
        raise EngineDeadStatus(str(e) or "the engine is dead") from None


@export
def glue_engine_reset_prefix_cache(key) -> None:
    record = engines.get_live(key)
    with record.lock:
        reset = record.engine.reset_prefix_cache()
    if not reset:
        raise InvalidStateError(
            "vllm_engine_reset_prefix_cache: the prefix cache was not reset because running "
            "requests hold KV blocks (vLLM's reset_prefix_cache returned False); retry once "
            "they are done")
