"""Launch configs of the fused MoE kernel: tuned JSON files per (E, N, dtype, block shape,
device), else upstream's default heuristic (its CUDA branches: block FP8, and the
general one for bf16/fp16/fp32 and per-tensor/per-channel FP8; no ROCm tiles, no
batch-invariant mode).

Mirrors vllm/model_executor/layers/fused_moe/fused_moe.py (get_config_file_name,
get_moe_configs, get_default_config, try_get_optimal_moe_config) and fused_moe/__init__.py
(override_config / get_config). File names are upstream's:
"E={E},N={N},device_name={name}[,dtype={dtype}][,block_shape=[{bn},{bk}]].json" with N the
expert intermediate size (w2's last dim), no dtype for bf16/fp16, "float32" for fp32 and
"fp8_w8a8" for FP8, the block shape of block-quantized FP8 weights; device names and the
file format are kernels/tuned_configs.py's (every H200 variant reads as NVIDIA_H200; an
H100 without its own file takes get_default_config). A file maps batch sizes M to configs;
the config of the nearest M is used. Looked up in $VLLM_TUNED_CONFIG_FOLDER first, then
kernels/configs/fused_moe/ (written by `python3 examples/bench/benchmark_moe.py --tune`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from libvllm.engine import envs
from libvllm.kernels.launch_configs import GemmConfig
from libvllm.kernels.tuned_configs import config_dir, config_file_name, find_configs, nearest
from libvllm.kernels.tuned_configs import device_name as get_device_name

CONFIG_DIR = config_dir("fused_moe")
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


def get_config_dtype_str(dtype: torch.dtype, use_fp8_w8a8: bool = False) -> str | None:
    """Upstream _get_config_dtype_str (fused_moe/config.py) for the schemes the engine
    runs: "fp8_w8a8" for FP8 experts, "float32" for fp32 (its own files), None for
    bf16/fp16."""
    if use_fp8_w8a8:
        return "fp8_w8a8"
    return "float32" if dtype == torch.float32 else None


def get_config_file_name(E: int, N: int, dtype: str | None, device_name: str | None = None,
                         block_shape: list[int] | None = None) -> str:
    return config_file_name({"E": E, "N": N}, device_name or get_device_name(), dtype,
                            block_shape)


@functools.lru_cache
def get_moe_configs(E: int, N: int, dtype: str | None, block_n: int | None = None,
                    block_k: int | None = None) -> dict[int, dict] | None:
    """{M: config} from the first tuned file found, or None."""
    block_shape = [block_n, block_k] if block_n and block_k else None
    name = get_config_file_name(E, N, dtype, block_shape=block_shape)
    folders = [envs.VLLM_TUNED_CONFIG_FOLDER, CONFIG_DIR]
    configs = find_configs(name, [f for f in folders if f], GemmConfig, "MoE layer", "MoE")
    return {m: cfg.kwargs() for m, cfg in configs.items()} if configs else None


def get_default_config(M: int, E: int, N: int, K: int, topk: int, dtype: str | None,
                       block_shape: list[int] | None = None) -> dict[str, int]:
    """Upstream's get_default_config on CUDA. Block FP8 ("fp8_w8a8" with block_shape
    [bn, bk]): BLOCK_SIZE_K = bk; BLOCK_SIZE_N = bn, or 64 for M <= 8 when 64 divides bn
    (the kernel reads block scales per N element, so an N tile dividing bn is valid);
    16-row M tiles up to M = 64; GROUP_SIZE_M 32 above M = 16. Otherwise (bf16/fp16, fp32,
    FP8 per tensor / per channel): small M is memory bound (tall K tiles, 16-row blocks),
    large M compute bound (big M/N tiles, 8 warps); FP8 always takes 128-deep K tiles."""
    if dtype == "fp8_w8a8" and block_shape is not None:
        small = M <= 8 and block_shape[0] % 64 == 0
        return {
            "BLOCK_SIZE_M": 16 if M <= 64 else 64,
            "BLOCK_SIZE_N": 64 if small else block_shape[0],
            "BLOCK_SIZE_K": block_shape[1],
            "GROUP_SIZE_M": 1 if M <= 16 else 32,
            "SPLIT_K": 1,
            "num_warps": 4,
            "num_stages": (4 if M <= 4 else 3) if small else 3,
        }
    block_m = 16 if M <= 32 else 32 if M <= 96 else 64 if M <= 512 else 128
    return {
        "BLOCK_SIZE_M": block_m,
        "BLOCK_SIZE_N": 64 if M <= 64 else 128,
        "BLOCK_SIZE_K": 128 if dtype == "fp8_w8a8" or M <= 64 else 64,
        "GROUP_SIZE_M": 16 if M // max(E, 1) > 128 else 1,
        "SPLIT_K": 1,
        "num_warps": 4 if M <= 128 else 8,
        "num_stages": 4 if M <= 32 else 3,
    }


def try_get_optimal_moe_config(w1_shape: tuple[int, ...], w2_shape: tuple[int, ...],
                               top_k: int, dtype: str | None, M: int,
                               block_shape: list[int] | None = None) -> dict[str, int]:
    """w1 [E, 2N, K], w2 [E, K, N], block_shape [bn, bk] of block-quantized weights: the
    override, else the tuned file's nearest M, else the default."""
    override = get_config()
    if override:
        return override
    E, _, N = w2_shape
    block_n, block_k = block_shape if block_shape else (None, None)
    configs = get_moe_configs(E, N, dtype, block_n, block_k)
    if configs:
        return nearest(configs, M)
    return get_default_config(M, E, N, w1_shape[2], top_k, dtype, block_shape)
