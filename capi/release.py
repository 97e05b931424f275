"""Gives a freed engine's memory back (vllm_engine_free, vllm_shutdown), as vLLM's
shutdown path does (vllm/distributed/parallel_state.py, cleanup_dist_env_and_memory:
gc.collect(), then the accelerator's empty_cache).

Why each step: the model's layers sit in reference cycles (each parameter's
`weight_loader` is a bound method of its layer, as in vLLM) and the KV cache's free-block
queue is a doubly linked list, so without a collection the weights and caches live until
Python's cyclic GC happens to run; CUDA's caching allocator keeps freed blocks until
empty_cache; glibc keeps freed heap pages (torch's large CPU buffers land in the heap
once glibc's dynamic mmap threshold has grown) until malloc_trim. Measured by
tests/test_runtime_memory.py (RSS after 10 create / generate / free cycles).
"""

from __future__ import annotations

import ctypes
import gc
import sys


def _malloc_trim():
    """glibc's malloc_trim, or None (another C library)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_TRIM = _malloc_trim()


def release_memory() -> None:
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    if _TRIM is not None:
        _TRIM(0)
