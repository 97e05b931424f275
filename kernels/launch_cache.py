"""Cached Triton launches: `kernel[grid](...)` without Triton's per-launch bookkeeping.

Triton's JITFunction.run (triton/runtime/jit.py, 3.6) redoes on every launch work whose
answer only changes with the variant: three knob reads, the current device, the pre-run
hooks, the variant's string cache key (`str(options)` of the launch options), the check
that no global it read changed, the launch metadata. An eager decode step of Llama-8B
makes ~230 launches, and that path is about half of the step's Python time (a cProfile of
an eager batch-1 decode step shows it): eager batch-1 is bound by the host CPU.

`cached_launch` wraps a launched `@triton.jit` kernel (not a helper other kernels call).
A launch binds its arguments with Triton's own binder (the per-kernel generated function
whose C specialization gives each argument its type, 16-byte alignment and divisibility:
exactly the variant key Triton computes), looks the variant up in a dict keyed by that
specialization and the launch options, and calls the compiled launcher directly with the
current stream. A miss, and every launch it cannot vouch for, goes through
`kernel[grid](...)` unchanged: the interpreter, precompile_triton's compile-only pass
(kernels/_common.py compiling()), a callable grid, launch hooks set (a profiler), a
variant key that does not hash. So which variant runs, and what it computes, is Triton's
choice as before; only the Python around the launch is skipped. The checks Triton drops
here: a global the kernel reads changing after its compile (kernels/ never rebinds one).
LIBVLLM_DISABLE_LAUNCH_CACHE=1 sends every launch through Triton (A/B benchmarks).
"""

from __future__ import annotations

from typing import Any

import triton
from triton.runtime.jit import JITFunction

from libvllm.kernels import envs
from libvllm.kernels._common import compiling

_ENABLED = not envs.LIBVLLM_DISABLE_LAUNCH_CACHE


class CachedLaunch:
    """A launched Triton kernel whose compiled variants are called directly after their
    first launch; `kernel[grid](*args, **kwargs)` as for a JITFunction."""

    def __init__(self, fn: JITFunction) -> None:
        self.fn = fn
        self.variants: dict[tuple, tuple] = {}  # (device, spec, options) -> launcher parts
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)
        self.__doc__ = fn.__doc__

    def __getitem__(self, grid: Any):
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def clear(self) -> None:
        """Forget the cached variants (and Triton's: the next launch asks for a compile)."""
        self.variants.clear()
        if isinstance(self.fn, JITFunction):
            self.fn.device_caches.clear()

    def launch(self, grid: Any, args: tuple, kwargs: dict) -> None:
        fn = self.fn
        runtime = triton.knobs.runtime
        if (not _ENABLED or not isinstance(fn, JITFunction) or compiling() or callable(grid)
                or _hooked(runtime.launch_enter_hook) or _hooked(runtime.launch_exit_hook)):
            return fn[grid](*args, **kwargs)
        driver = triton.runtime.driver.active
        device = driver.get_current_device()
        caches = fn.device_caches.get(device)
        if caches is None:
            return self._miss(grid, args, kwargs, None)
        params, spec, options = caches[-1](*args, **kwargs)  # Triton's binder
        key = (device, tuple(spec), tuple(options.items()))
        try:
            parts = self.variants.get(key)
        except TypeError:  # a constexpr or option that does not hash
            return fn[grid](*args, **kwargs)
        if parts is None:
            return self._miss(grid, args, kwargs, key)
        run, function, metadata = parts
        n = len(grid)
        run(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1,
            driver.get_current_stream(device), function, metadata, None, None, None,
            *params.values())

    def _miss(self, grid: Any, args: tuple, kwargs: dict, key: tuple | None) -> None:
        """Launch through Triton (compiling the variant if it must) and keep its launcher."""
        kernel = self.fn[grid](*args, **kwargs)
        if key is not None and kernel is not None:
            self.variants[key] = (kernel.run, kernel.function, kernel.packed_metadata)


def _hooked(hook: Any) -> bool:
    """Whether a launch hook is set: None or an empty HookChain (Triton 3.9) is not."""
    return hook is not None and bool(getattr(hook, "calls", True))


def cached_launch(fn: JITFunction) -> CachedLaunch:
    """Decorator over `@triton.jit` of a kernel launched from Python (kernels/ launchers)."""
    return CachedLaunch(fn)
