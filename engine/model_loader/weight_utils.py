"""Safetensors checkpoint files of a Hugging Face directory: which files, and their tensors.

Mirrors vllm/model_executor/model_loader/weight_utils.py (filter_duplicate_safetensors_files,
safetensors_weights_iterator) and default_loader.py's file selection: the files named by
model.safetensors.index.json when it exists, else every *.safetensors file. Index entries
must be plain file names inside the directory. Headers are parsed by the `safetensors`
library (bounded header, checked offsets); only F32 / F16 / BF16 tensors are accepted, and
F8_E4M3 (float8_e4m3fn), whose scales and config engine/model_loader/fp8_weights.py checks.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import torch
from safetensors import SafetensorError, safe_open

from libvllm.engine.errors import ModelLoadError, UnsupportedError
from libvllm.engine.load_progress import track
from libvllm.engine.model_loader.hf_config import read_json_object

INDEX_FILE = "model.safetensors.index.json"
MAX_INDEX_BYTES = 64 << 20
_DTYPES = {torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn}
_HEADER_DTYPES = {"F32", "F16", "BF16", "F8_E4M3"}


def safetensors_files(model_dir: str) -> list[str]:
    """Checkpoint files to load, in a stable order."""
    index = os.path.join(model_dir, INDEX_FILE)
    if os.path.isfile(index):
        weight_map = read_json_object(index, MAX_INDEX_BYTES).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelLoadError(f"{index}: weight_map must be a non-empty object")
        names = set()
        for tensor, fname in weight_map.items():
            if not isinstance(fname, str) or os.path.basename(fname) != fname or \
                    fname in ("", ".", "..") or not fname.endswith(".safetensors"):
                raise ModelLoadError(f"{index}: bad file name {fname!r} for {tensor!r}")
            names.add(fname)
    else:
        names = {f for f in os.listdir(model_dir) if f.endswith(".safetensors")}
    if not names:
        if any(f.endswith((".bin", ".pt", ".pth")) for f in os.listdir(model_dir)):
            raise UnsupportedError(f"{model_dir}: only safetensors checkpoints are supported "
                                   "(PyTorch pickle files are not loaded)")
        raise ModelLoadError(f"{model_dir}: no *.safetensors files")
    files = [os.path.join(model_dir, n) for n in sorted(names)]
    for f in files:
        if not os.path.isfile(f):
            raise ModelLoadError(f"checkpoint file {f} does not exist")
    return files


def open_safetensors(path: str):
    try:
        return safe_open(path, framework="pt")
    except (SafetensorError, OSError, ValueError) as e:
        raise ModelLoadError(f"{path}: invalid safetensors file: {e}") from None


def checkpoint_numel(files: list[str]) -> int:
    """Total elements over every tensor header (no tensor data is read); dtypes checked."""
    total = 0
    for path in files:
        with open_safetensors(path) as f:
            for name in f.keys():
                sl = f.get_slice(name)
                if sl.get_dtype() not in _HEADER_DTYPES:
                    raise UnsupportedError(f"{path}: tensor {name!r} has dtype {sl.get_dtype()}; "
                                           "supported: F32, F16, BF16, F8_E4M3")
                shape = sl.get_shape()
                n = 1
                for d in shape:
                    n *= d
                total += n
    return total


def safetensors_weights_iterator(files: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor of every file; tensors are memory-mapped views."""
    for part, path in enumerate(files):
        with open_safetensors(path) as f:
            names = list(f.keys())
            for name in track(names, len(names), part, len(files)):  # engine/load_progress.py
                try:
                    t = f.get_tensor(name)
                except (SafetensorError, TypeError, ValueError, RuntimeError) as e:
                    raise ModelLoadError(f"{path}: tensor {name!r}: {e}") from None
                if t.dtype not in _DTYPES:
                    raise UnsupportedError(f"{path}: tensor {name!r} has dtype {t.dtype}; "
                                           "supported: float32, float16, bfloat16, "
                                           "float8_e4m3fn")
                yield name, t
