"""Every environment variable engine/ reads, as vllm/envs.py: one table of name -> reader
(default and parser in one lambda), read lazily on each attribute access
(`from libvllm.engine import envs; envs.VLLM_ENABLE_V1_MULTIPROCESSING`), so a test or a host that
sets a variable before the read sees it (a module that copies a value into a constant at
import, as engine/layers/gdn.py GDN_PREFILL_BACKEND, fixes it then). No other module of
engine/ touches os.environ (tests/test_config_frozen.py scans for it); launchers build a
child's environment from child_environment(). kernels/ reads its own few through
kernels/envs.py (it imports nothing from engine/), and capi/libvllm.c reads LIBVLLM_PYTHON
before Python starts.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from libvllm.engine.errors import InvalidArgumentError


def _int(name: str, default: int | None) -> int | None:
    value = os.environ.get(name)
    if value is None or not value.strip():
        return default
    try:
        return int(value)
    except ValueError:
        raise InvalidArgumentError(f"environment variable {name} must be an integer") from None


def _flag(name: str, default: bool) -> bool:
    """vLLM's "1" / "true" (any case) parse; unset: default."""
    value = os.environ.get(name)
    return default if value is None else value.strip().lower() in ("1", "true")


def _tristate(name: str) -> bool | None:
    """"1" / "0", None when unset or empty; anything else is an error."""
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    if value not in ("0", "1"):
        raise InvalidArgumentError(f"{name} must be 0 or 1, got {value!r}")
    return value == "1"


def _str(name: str, default: str | None) -> str | None:
    value = os.environ.get(name, "").strip()
    return value or default


environment_variables: dict[str, Callable[[], Any]] = {
    # --- vLLM's ---
    # the engine core in a child process; None: EngineConfig.multiprocessing's rule
    # (engine/engine_core/core_client.py use_multiprocessing)
    "VLLM_ENABLE_V1_MULTIPROCESSING": lambda: _tristate("VLLM_ENABLE_V1_MULTIPROCESSING"),
    # (CPU) the KV cache's size in GiB (vLLM's legacy VLLM_CPU_KVCACHE_SPACE); here the cap
    # of the CPU default, which takes no more than max_num_seqs full contexts need; unset
    # or 0: 4 GiB (engine/engine_core/engine_core.py)
    "VLLM_CPU_KVCACHE_SPACE": lambda: _int("VLLM_CPU_KVCACHE_SPACE", None),
    # seconds the front end waits for the engine core's ready message
    "VLLM_ENGINE_READY_TIMEOUT_S":
        lambda: float(os.environ.get("VLLM_ENGINE_READY_TIMEOUT_S", "600")),
    # tool_choice "required" / named tools constrained by a grammar
    "VLLM_ENFORCE_STRICT_TOOL_CALLING":
        lambda: _flag("VLLM_ENFORCE_STRICT_TOOL_CALLING", True),
    # seconds a structured-output regex may take to compile
    "VLLM_REGEX_COMPILATION_TIMEOUT_S": lambda: _int("VLLM_REGEX_COMPILATION_TIMEOUT_S", 5),
    # xgrammar's compiled-grammar cache, MiB
    "VLLM_XGRAMMAR_CACHE_MB": lambda: _int("VLLM_XGRAMMAR_CACHE_MB", 512),
    # a folder of tuned fused-MoE configs searched before the shipped ones
    "VLLM_TUNED_CONFIG_FOLDER": lambda: _str("VLLM_TUNED_CONFIG_FOLDER", None),
    # the Responses API's store (store=true, previous_response_id) and its bounds
    "VLLM_ENABLE_RESPONSES_API_STORE": lambda: _flag("VLLM_ENABLE_RESPONSES_API_STORE", False),
    "VLLM_RESPONSES_API_STORE_MAX_ENTRIES":
        lambda: _int("VLLM_RESPONSES_API_STORE_MAX_ENTRIES", 1024),
    "VLLM_RESPONSES_API_STORE_MAX_BYTES":
        lambda: _int("VLLM_RESPONSES_API_STORE_MAX_BYTES", 64 << 20),
    # --- libvllm's ---
    # the python that runs the engine-core child and tensor-parallel workers
    "LIBVLLM_PYTHON": lambda: _str("LIBVLLM_PYTHON", None),
    # seconds the tensor-parallel rendezvous and collectives wait
    "LIBVLLM_DIST_TIMEOUT_S": lambda: float(os.environ.get("LIBVLLM_DIST_TIMEOUT_S", "300")),
    # hybrid GDN prefill: auto | recurrent | triton (engine/layers/gdn.py checks it)
    "LIBVLLM_GDN_PREFILL_BACKEND": lambda: os.environ.get("LIBVLLM_GDN_PREFILL_BACKEND", "auto"),
    # fused MoE backend: triton | ... (engine/layers/fused_moe/layer.py checks it)
    "LIBVLLM_MOE_BACKEND": lambda: os.environ.get("LIBVLLM_MOE_BACKEND", "triton"),
    # "1" turns off a fusion, for A/B runs of the fused and unfused paths
    "LIBVLLM_DISABLE_QKV_ROPE_FOLD": lambda: os.environ.get("LIBVLLM_DISABLE_QKV_ROPE_FOLD") == "1",
    "LIBVLLM_DISABLE_NORM_ROUTER_FOLD":
        lambda: os.environ.get("LIBVLLM_DISABLE_NORM_ROUTER_FOLD") == "1",
    # --- third parties' ---
    "LLGUIDANCE_LOG_LEVEL": lambda: _int("LLGUIDANCE_LOG_LEVEL", 1),  # llguidance's logs
    # set: torch's thread count is the user's (engine/worker/torch_threads.py)
    "OMP_NUM_THREADS": lambda: os.environ.get("OMP_NUM_THREADS"),
    # the seed of the prefix-cache hash (engine/core/kv_cache_utils.py); None: vLLM's fixed one
    "PYTHONHASHSEED": lambda: os.environ.get("PYTHONHASHSEED"),
    # torch.distributed's launcher variables (torchrun; engine/executor/)
    "RANK": lambda: _int("RANK", None),
    "WORLD_SIZE": lambda: _int("WORLD_SIZE", None),
    "LOCAL_RANK": lambda: _int("LOCAL_RANK", None),
    "MASTER_ADDR": lambda: _str("MASTER_ADDR", None),
    "MASTER_PORT": lambda: _str("MASTER_PORT", None),
}


def __getattr__(name: str) -> Any:
    """The variable's value, read now (vLLM's lazy module attribute)."""
    if name in environment_variables:
        return environment_variables[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return list(environment_variables)


def child_environment() -> dict[str, str]:
    """A copy of this process's environment, for a child the engine starts."""
    return dict(os.environ)
