"""capi.engine_state: vllm_engine_check_health and vllm_engine_reset_prefix_cache (since
ABI 1.3), over the engine session's check_health and reset_prefix_cache.

Error mapping as vllm/entrypoints/serve/instrumentator/health.py: an EngineDeadError is
"unhealthy" (VLLM_ERR_ENGINE_DEAD here, 503 there); any other error propagates. A reset
refused because running requests hold KV blocks (vLLM's reset_prefix_cache returned
False) is VLLM_ERR_INVALID_STATE.
"""

from __future__ import annotations

from _libvllm import lib

from libvllm.capi.plumbing import engines, export
from libvllm.engine.session import EngineDeadError, InvalidStateError, VllmError


class EngineDeadStatus(VllmError):
    status = lib.VLLM_ERR_ENGINE_DEAD


@export
def glue_engine_check_health(key) -> None:
    session = engines.get_live(key).session
    try:
        session.check_health()
    except EngineDeadError as e:
        raise EngineDeadStatus(str(e) or "the engine is dead") from None


@export
def glue_engine_reset_prefix_cache(key) -> None:
    if not engines.get_live(key).session.reset_prefix_cache():
        raise InvalidStateError(
            "vllm_engine_reset_prefix_cache: the prefix cache was not reset because running "
            "requests hold KV blocks (vLLM's reset_prefix_cache returned False); retry once "
            "they are done")
