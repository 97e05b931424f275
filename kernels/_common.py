"""Launcher helpers shared by the kernel files: argument checks that raise InvalidArgumentError
(kernels/errors.py, the class engine/errors.py re-exports: VLLM_ERR_INVALID_ARGUMENT, HTTP 400),
and programmatic dependent launch (PDL, sm_90+): a kernel launched with it may start while
the kernel before it drains, and calls pdl_wait() before it touches memory (the wait
returns once that kernel finished and flushed), then lets the next kernel launch early in
turn. In a CUDA graph of tiny decode kernels this hides most of each launch gap.
LIBVLLM_DISABLE_PDL=1 turns it off (A/B benchmarks); the interpreter never uses it.
Also precompile_triton: Triton's JIT compiles of a start-up pass, on a thread pool, and
compiling(): whether this thread's launches only compile (a launcher whose output torch
ops read as indices gives them valid values then).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar

import torch
import triton
import triton.language as tl

from libvllm.kernels import envs
from libvllm.kernels.errors import InvalidArgumentError

# Activation dtypes every kernel accepts.
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check(cond: bool, msg: str | Callable[[], str]) -> None:
    """Raise InvalidArgumentError(msg) unless cond: launchers validate before touching memory.
    A message with formatted values is a lambda, built only on failure (an f-string costs
    microseconds on every launch, which an eager step pays ~300 times)."""
    if not cond:
        raise InvalidArgumentError(msg() if callable(msg) else msg)


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for ints: triton.cdiv is a ConstexprFunction in Triton 3.9 whose call from
    Python costs microseconds; launchers use these two plain ones."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1), as triton.next_power_of_2."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def check_float(name: str, t: torch.Tensor) -> None:
    check(t.dtype in FLOAT_DTYPES,
          lambda: f"{name} must be float32, float16 or bfloat16, got {t.dtype}")


def check_same_device(**tensors: torch.Tensor) -> None:
    devices = {t.device for t in tensors.values()}
    check(len(devices) == 1,
          lambda: f"{', '.join(tensors)} must be on one device, got {sorted(map(str, devices))}")


@functools.cache
def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (grid sizing); 4 for the Triton
    interpreter on CPU, which keeps test grids small."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


@functools.cache
def _pdl_supported(device_index: int) -> bool:
    return (not envs.TRITON_INTERPRET and not envs.LIBVLLM_DISABLE_PDL
            and torch.cuda.get_device_capability(device_index)[0] >= 9)


def pdl_launch(t: torch.Tensor) -> dict:
    """Launch options of a kernel whose tensors live with `t`: USE_PDL for its pdl_wait()
    and Triton's launch_pdl flag, both on for a CUDA device of compute capability >= 9."""
    on = t.is_cuda and _pdl_supported(t.device.index or 0)
    return {"USE_PDL": on, "launch_pdl": on}


@triton.jit
def pdl_wait():
    """Wait for the kernel before (all of it, its writes visible), then let the next launch.
    Every kernel calls this before it reads any activation and before it lets the next
    kernel launch, so a kernel only starts once the one before it has passed its own wait:
    loads placed BEFORE this call may rely on data written two or more launches back, never
    on the launch just before (kernels/fused_moe_gemv.py's routed w2 reads the router logits
    early), or on weights, never written during a step (kernels/rms_norm_gemv.py loads its
    router rows early). Triggering dependents earlier would break that."""
    tl.extra.cuda.gdc_wait()
    tl.extra.cuda.gdc_launch_dependents()


_COMPILING: ContextVar[bool] = ContextVar("libvllm_compiling", default=False)


def compiling() -> bool:
    """Whether Triton launches from this thread only compile (inside precompile_triton, off
    the interpreter): their outputs keep whatever memory held, so a launcher whose integer
    output torch ops use as indices (kernels/moe_topk_softmax.py's expert ids, read by the
    torch alignment past its pair limit and the torch experts) zero-fills it first."""
    return _COMPILING.get()


@contextlib.contextmanager
def precompile_triton(workers: int = 0) -> Iterator[None]:
    """Inside, a Triton kernel launch made in this context only compiles its variant, on a
    pool of `workers` threads (0: one per CPU this process may use, at most 32), and
    launches nothing: JITFunction.run as a warmup under Triton's AsyncCompileMode (launches
    from other threads pass through). On exit every compile has finished and sits in its
    kernel's cache, so the same launches after it compile nothing. Triton compiles mostly
    outside the GIL (MLIR, LLVM, ptxas): engine/model_loader/gguf_quant.py
    precompile_gguf_kernels compiles a Q4_K_M Llama-8B's GGUF variants side by side rather
    than one at a time (the start-up time `python -m examples.bench startup` reports). Each
    variant's pending compile is kept in its kernel's cache as it is submitted (Triton 3.6
    keeps it only in the mode, so every later launch of the variant would hash the kernel's
    source again, thousands of times in a graph capture pass). The tensors the skipped
    kernels would write keep whatever they held. Nothing changes under the interpreter."""
    if envs.TRITON_INTERPRET:
        yield
        return
    from triton.runtime import _async_compile
    from triton.runtime.jit import JITFunction

    run, do_compile = JITFunction.run, JITFunction._do_compile
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    with ThreadPoolExecutor(workers or min(32, cpus or 1)) as pool:
        mode = _async_compile.AsyncCompileMode(pool)

        def compile_only(self, *args, grid, warmup, **kwargs):
            mine = _async_compile.active_mode.get() is mode
            return run(self, *args, grid=grid, warmup=warmup or mine, **kwargs)

        kept: list[tuple[dict, object, object]] = []  # (kernel cache, key, FutureKernel)

        def compile_kept(self, key, signature, device, *args, **kwargs):
            kernel = do_compile(self, key, signature, device, *args, **kwargs)
            cache = self.device_caches[device][0]
            if kernel is not None and _async_compile.active_mode.get() is mode \
                    and cache.setdefault(key, kernel) is kernel:
                kept.append((cache, key, kernel))
            return kernel

        JITFunction.run, JITFunction._do_compile = compile_only, compile_kept
        token = _COMPILING.set(True)
        try:
            with mode:
                yield
        finally:
            _COMPILING.reset(token)
            JITFunction.run, JITFunction._do_compile = run, do_compile
            _async_compile.active_mode.set(None)  # Triton 3.6 keeps it when a compile fails
            for cache, key, kernel in kept:  # a compile that failed leaves no placeholder
                if cache.get(key) is kernel:
                    del cache[key]
