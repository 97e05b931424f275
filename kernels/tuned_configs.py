"""The loader of the Triton kernels' tuned launch configs: vLLM's JSON files.

A config is a kernels/launch_configs.py record (GemmConfig for the vLLM-mirrored GEMMs,
whose keys are vLLM's). A tuned config file is vLLM's: one per kernel, shape and device,
in kernels/configs/<kernel>/, named
"<shape>,device_name=<device>[,dtype=<dtype>][,block_shape=[<bn>,<bk>]].json" (e.g.
fused_moe "E=128,N=768,device_name=NVIDIA_H200.json", fp8_block
"N=4096,K=14336,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"). It
maps batch sizes M (the JSON keys; a "triton_version" key is ignored) to a config; a
launch of M tokens takes the config of the nearest M (the first of equals in file order).
A malformed file raises InvalidArgumentError naming the file; without a file the kernel's
rule in code applies (its config function's docstring states the rule).

Device names: the CUDA device name with each run of whitespace or "/" as "_", every H200
variant read as NVIDIA_H200 (an H200 NVL takes the H200 SXM's files), "cpu" without CUDA.
An H100 ("NVIDIA_H100_80GB_HBM3") reads its own files and, where a kernel has none for
it, takes the kernel's rule.

Mirrors vllm/model_executor/layers/fused_moe/fused_moe.py (get_config_file_name,
get_moe_configs, try_get_optimal_moe_config's nearest batch size),
vllm/model_executor/layers/quantization/utils/fp8_utils.py (get_w8a8_block_fp8_configs)
and vllm/utils/platform_utils.py (get_device_name_as_file_name).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from typing import TypeVar

import torch

from libvllm.kernels.errors import InvalidArgumentError
from libvllm.kernels.launch_configs import LaunchConfig

logger = logging.getLogger(__name__)
CONFIG_ROOT = os.path.join(os.path.dirname(os.path.realpath(__file__)), "configs")


R = TypeVar("R", bound=LaunchConfig)


def device_name() -> str:
    """The current CUDA device's name as config files spell it; "cpu" without CUDA."""
    if not torch.cuda.is_available():
        return "cpu"
    name = re.sub(r"[\s/]+", "_", torch.cuda.get_device_name())
    return "NVIDIA_H200" if "H200" in name.split("_") else name


def config_dir(kernel: str) -> str:
    """kernels/configs/<kernel>: the shipped tuned files of one kernel."""
    return os.path.join(CONFIG_ROOT, kernel)


def config_file_name(shape: dict[str, int], device: str, dtype: str | None = None,
                     block_shape: list[int] | None = None) -> str:
    """vLLM's file name: the shape's keys in order, the device, then the dtype and the
    quantization block shape where given (a block shape holding a 0 is none)."""
    dims = ",".join(f"{key}={value}" for key, value in shape.items())
    dtype_selector = f",dtype={dtype}" if dtype else ""
    block_selector = (f",block_shape=[{block_shape[0]},{block_shape[1]}]"
                      if block_shape and all(block_shape) else "")
    return f"{dims},device_name={device}{dtype_selector}{block_selector}.json"


def parse_record(record: type[R], data: object, where: str) -> R:
    """One JSON config -> `record`, or InvalidArgumentError naming `where`."""
    if not isinstance(data, dict):
        raise InvalidArgumentError(f"{where}: a config must be a JSON object, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(record)}
    unknown = sorted(set(data) - set(fields))
    missing = sorted(name for name, f in fields.items()
                     if f.default is dataclasses.MISSING and name not in data)
    if unknown or missing:
        raise InvalidArgumentError(f"{where}: {record.__name__} takes {sorted(fields)}; "
                                   f"unknown {unknown}, missing {missing}")
    try:
        return record(**data)
    except ValueError as e:
        raise InvalidArgumentError(f"{where}: {e}") from None


def read_config_file(path: str, record: type[R]) -> dict[int, R]:
    """A tuned file -> {M: record} in file order; InvalidArgumentError naming the file for
    anything else than a JSON object of batch sizes >= 1 to valid configs."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise InvalidArgumentError(f"tuned config file {path}: {e}") from None
    if not isinstance(data, dict):
        raise InvalidArgumentError(f"tuned config file {path}: must be a JSON object of "
                                   f"batch size -> config")
    data.pop("triton_version", None)
    configs = {}
    for key, value in data.items():
        m = int(key) if isinstance(key, str) and key.isdigit() else 0
        if m < 1:
            raise InvalidArgumentError(f"tuned config file {path}: key {key!r} is not a "
                                       f"batch size >= 1")
        configs[m] = parse_record(record, value, f"tuned config file {path}, M={key}")
    if not configs:
        raise InvalidArgumentError(f"tuned config file {path}: holds no config")
    return configs


def find_configs(file_name: str, folders: list[str], record: type[R], used_for: str,
                 default_name: str) -> dict[int, R] | None:
    """{M: record} of the first folder holding file_name, else None; logged as vLLM logs
    it ("Using configuration from <path> for <used_for>.", "Using default <default_name>
    config. ...")."""
    paths = [os.path.join(folder, file_name) for folder in folders]
    for path in paths:
        if os.path.exists(path):
            logger.info("Using configuration from %s for %s.", path, used_for)
            return read_config_file(path, record)
    logger.warning("Using default %s config. Performance might be sub-optimal! Config file "
                   "not found at %s", default_name, ", ".join(paths))
    return None


def nearest(configs: dict[int, R], m: int) -> R:
    """The config of the batch size nearest m (vLLM's min over the keys by |key - m|)."""
    return configs[min(configs, key=lambda key: abs(key - m))]
