"""Which platform this process would run on, found without importing torch, as
vllm/platforms/__init__.py `cuda_platform_plugin` (NVML's device count).

The front end chooses the engine-core mode with it (engine/engine_core/core_client.py): a child
core on CUDA, in process on the CPU. The core itself resolves its device with torch
(engine/worker/model_load.py resolve_device), so a GPU that NVML reports but torch
cannot use (a CPU-only torch build, CUDA_VISIBLE_DEVICES="") gives a child core on the
CPU. NVML (libnvidia-ml.so.1) ships with every NVIDIA driver; no package is needed. Where
it cannot be loaded (no driver, or a container given the driver's compute libraries only)
torch answers, as before this module: a CPU machine imports torch for its in-process core
anyway.
"""

from __future__ import annotations

import ctypes

NVML_LIBRARY = "libnvidia-ml.so.1"


def _load_nvml():
    return ctypes.CDLL(NVML_LIBRARY)


def cuda_platform_available() -> bool:
    """True when the NVIDIA driver reports at least one GPU."""
    try:
        nvml = _load_nvml()
    except OSError:
        import torch

        return torch.cuda.is_available()
    if nvml.nvmlInit_v2() != 0:
        return False
    try:
        count = ctypes.c_uint(0)
        return nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0 and count.value > 0
    finally:
        nvml.nvmlShutdown()
