"""Launch configs of the fused MoE kernel: tuned JSON files per (E, N, dtype, device), else
upstream's default heuristic.

Mirrors vllm/model_executor/layers/fused_moe/fused_moe.py (get_config_file_name,
get_moe_configs, get_default_config, try_get_optimal_moe_config) and fused_moe/__init__.py
(override_config / get_config). File names are upstream's:
"E={E},N={N},device_name={name}[,dtype={dtype}].json" with N the expert intermediate size
(w2's last dim), the device name with spaces as underscores (any H200 variant reads as
NVIDIA_H200), no dtype for bf16/fp16 and "float32" for fp32. A file maps batch sizes M to
configs; the config of the nearest M is used. Looked up in $VLLM_TUNED_CONFIG_FOLDER first,
then configs/ beside this file (written by examples/bench/benchmark_moe.py --tune).
"""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from engine import envs

logger = logging.getLogger(__name__)
CONFIG_DIR = os.path.join(os.path.dirname(os.path.realpath(__file__)), "configs")
_override: dict | None = None


@contextmanager
def override_config(config: dict | None) -> Iterator[None]:
    """Use `config` for every fused MoE launch inside the block (the tuner's hook)."""
    global _override
    old, _override = _override, config
    try:
        yield
    finally:
        _override = old


def get_config() -> dict | None:
    return _override


def get_config_dtype_str(dtype: torch.dtype) -> str | None:
    """Upstream _get_config_dtype_str, unquantized: fp32 has its own files."""
    return "float32" if dtype == torch.float32 else None


def get_device_name() -> str:
    name = torch.cuda.get_device_name().replace(" ", "_") if torch.cuda.is_available() \
        else "cpu"
    return "NVIDIA_H200" if "H200" in name.split("_") else name


def get_config_file_name(E: int, N: int, dtype: str | None, device_name: str | None = None
                         ) -> str:
    device_name = device_name or get_device_name()
    dtype_selector = f",dtype={dtype}" if dtype else ""
    return f"E={E},N={N},device_name={device_name}{dtype_selector}.json"


@functools.lru_cache
def get_moe_configs(E: int, N: int, dtype: str | None) -> dict[int, dict] | None:
    """{M: config} from the first tuned file found, or None."""
    name = get_config_file_name(E, N, dtype)
    folders = [envs.VLLM_TUNED_CONFIG_FOLDER, CONFIG_DIR]
    for path in (os.path.join(f, name) for f in folders if f):
        if os.path.exists(path):
            with open(path) as f:
                tuned = json.load(f)
            tuned.pop("triton_version", None)
            logger.info("Using configuration from %s for MoE layer.", path)
            return {int(m): cfg for m, cfg in tuned.items()}
    logger.warning("Using default MoE config. Performance might be sub-optimal! Config "
                   "file not found at %s", name)
    return None


def get_default_config(M: int, E: int, N: int, K: int, topk: int, dtype: str | None
                       ) -> dict[str, int]:
    """Upstream's bf16/fp16 defaults: small M is memory bound (tall K tiles, 16-row
    blocks), large M compute bound (big M/N tiles, 8 warps)."""
    block_m = 16 if M <= 32 else 32 if M <= 96 else 64 if M <= 512 else 128
    return {
        "BLOCK_SIZE_M": block_m,
        "BLOCK_SIZE_N": 64 if M <= 64 else 128,
        "BLOCK_SIZE_K": 128 if M <= 64 else 64,
        "GROUP_SIZE_M": 16 if M // max(E, 1) > 128 else 1,
        "SPLIT_K": 1,
        "num_warps": 4 if M <= 128 else 8,
        "num_stages": 4 if M <= 32 else 3,
    }


def try_get_optimal_moe_config(w1_shape: tuple[int, ...], w2_shape: tuple[int, ...],
                               top_k: int, dtype: str | None, M: int) -> dict[str, int]:
    """w1 [E, 2N, K], w2 [E, K, N]: the override, else the tuned file's nearest M, else
    the default."""
    override = get_config()
    if override:
        return override
    E, _, N = w2_shape
    configs = get_moe_configs(E, N, dtype)
    if configs:
        return configs[min(configs, key=lambda m: abs(m - M))]
    return get_default_config(M, E, N, w1_shape[2], top_k, dtype)
