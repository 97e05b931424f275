"""Launcher helpers shared by the kernel files: argument checks that raise the engine's errors."""

from __future__ import annotations

import torch

from engine.errors import InvalidArgumentError

# Activation dtypes every kernel accepts.
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check(cond: bool, msg: str) -> None:
    """Raise InvalidArgumentError(msg) unless cond: launchers validate before touching memory."""
    if not cond:
        raise InvalidArgumentError(msg)


def check_float(name: str, t: torch.Tensor) -> None:
    check(t.dtype in FLOAT_DTYPES, f"{name} must be float32, float16 or bfloat16, got {t.dtype}")


def check_same_device(**tensors: torch.Tensor) -> None:
    devices = {str(t.device) for t in tensors.values()}
    check(len(devices) == 1, f"{', '.join(tensors)} must be on one device, got {sorted(devices)}")
