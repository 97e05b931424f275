"""The environment variables kernels/ reads, as vllm/envs.py (one table of name ->
reader, read on each attribute access). kernels/ imports nothing from engine/, so it
keeps this module of its own beside engine/envs.py; no other module of kernels/ touches
os.environ (tests/test_config_frozen.py scans for it).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

environment_variables: dict[str, Callable[[], Any]] = {
    # Triton's interpreter (CPU runs of the kernels): no PTX asm, no libdevice, no PDL
    "TRITON_INTERPRET": lambda: os.environ.get("TRITON_INTERPRET") == "1",
    # "1": no programmatic dependent launch on Hopper (A/B runs)
    "LIBVLLM_DISABLE_PDL": lambda: os.environ.get("LIBVLLM_DISABLE_PDL") == "1",
    # "1": every launch through Triton's own dispatch (kernels/launch_cache.py off)
    "LIBVLLM_DISABLE_LAUNCH_CACHE":
        lambda: os.environ.get("LIBVLLM_DISABLE_LAUNCH_CACHE") == "1",
}


def __getattr__(name: str) -> Any:
    """The variable's value, read now (vLLM's lazy module attribute)."""
    if name in environment_variables:
        return environment_variables[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return list(environment_variables)
