"""kernels/launch_cache.py: a cached launch runs the variant Triton would pick, and only the
launches it can vouch for skip JITFunction.run.

Oracle: the kernel's result in plain torch (x * SCALE), and Triton's own launch path
(JITFunction.run) counted by a spy. No upstream test (vLLM launches Triton through
JITFunction.run and relies on CUDA graphs); the cases follow what Triton specializes a
variant on (triton/runtime/jit.py create_function_from_signature: argument types, 16-byte
pointer alignment, integers equal to 1 or divisible by 16, constexpr values, launch
options).
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from test_kernels_common import DEVICE, ON_CUDA, gpu
from triton.runtime.jit import JITFunction

from libvllm.kernels._common import precompile_triton
from libvllm.kernels.launch_cache import CachedLaunch, cached_launch


@cached_launch
@triton.jit
def _scale_kernel(x_ptr, out_ptr, n, SCALE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * SCALE, mask=mask)


def _launch(x: torch.Tensor, out: torch.Tensor, scale: float, **options) -> None:
    n = x.numel()
    _scale_kernel[(triton.cdiv(n, 32),)](x, out, n, SCALE=scale, BLOCK=32, **options)


@pytest.fixture
def triton_runs(monkeypatch) -> list[str]:
    """The launches that went through JITFunction.run while the test runs."""
    runs: list[str] = []
    run = JITFunction.run

    def spy(self, *args, **kwargs):
        runs.append(self.fn.__name__)
        return run(self, *args, **kwargs)

    monkeypatch.setattr(JITFunction, "run", spy)
    _scale_kernel.clear()
    return runs


def test_cached_launches_compute_what_the_kernel_does() -> None:
    """Sizes on both sides of Triton's divisibility by 16, two constexpr values, an aligned
    and an unaligned pointer (a view 4 bytes in): every result is x * SCALE."""
    _scale_kernel.clear()
    base = torch.arange(200, dtype=torch.float32, device=DEVICE)  # [200]
    for x in (base[:64], base[:64], base[:33], base[1:65], base[:1]):
        for scale in (2.0, 3.0, 2.0):
            out = torch.full_like(x, -1.0)
            _launch(x, out, scale)
            torch.testing.assert_close(out, x * scale)
    if not ON_CUDA:  # the interpreter launches through Triton: nothing is cached
        assert isinstance(_scale_kernel, CachedLaunch) and _scale_kernel.variants == {}


@gpu
def test_a_variant_launched_before_skips_triton_run(triton_runs) -> None:
    """The first launch of a variant goes through JITFunction.run, the same variant after it
    does not; a new constexpr value, an integer no longer divisible by 16, an unaligned
    pointer and new launch options are new variants, each launched through Triton once."""
    base = torch.arange(200, dtype=torch.float32, device=DEVICE)  # [200]
    out = torch.empty(200, dtype=torch.float32, device=DEVICE)  # [200]
    _launch(base[:64], out[:64], 2.0)  # Triton's per-device caches appear
    _launch(base[:64], out[:64], 2.0)  # a variant now kept
    triton_runs.clear()
    for _ in range(3):
        _launch(base[:64], out[:64], 2.0)
    assert triton_runs == []
    for args, options in [((base[:64], out[:64], 3.0), {}), ((base[:33], out[:33], 2.0), {}),
                          ((base[1:65], out[1:65], 2.0), {}),
                          ((base[:64], out[:64], 2.0), {"num_warps": 2})]:
        triton_runs.clear()
        _launch(*args, **options)
        _launch(*args, **options)
        assert triton_runs == ["_scale_kernel"], args
        torch.testing.assert_close(args[1], args[0] * args[2])
    assert len(_scale_kernel.variants) == 5


@gpu
def test_launch_hooks_and_callable_grids_go_through_triton(triton_runs, monkeypatch) -> None:
    """A launch hook set (a profiler's) sees every launch; a grid given as a function of the
    launch's arguments is Triton's to evaluate."""
    x = torch.arange(64, dtype=torch.float32, device=DEVICE)  # [64]
    out = torch.empty_like(x)
    for _ in range(2):
        _launch(x, out, 2.0)
    seen: list[str] = []
    monkeypatch.setattr(triton.knobs.runtime, "launch_enter_hook",
                        lambda metadata: seen.append(metadata.get()["name"]))
    triton_runs.clear()
    _launch(x, out, 2.0)
    assert triton_runs == ["_scale_kernel"] and seen == ["_scale_kernel"]
    monkeypatch.undo()
    out.zero_()
    _scale_kernel[lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),)](
        x, out, 64, SCALE=4.0, BLOCK=32)
    torch.testing.assert_close(out, x * 4.0)


@gpu
def test_precompile_pass_launches_nothing_for_a_kept_variant() -> None:
    """kernels/_common.py precompile_triton only compiles: a variant the cache keeps must not
    run from inside it either."""
    x = torch.arange(64, dtype=torch.float32, device=DEVICE)  # [64]
    out = torch.empty_like(x)
    for _ in range(2):
        _launch(x, out, 2.0)
    out.fill_(-1.0)
    with precompile_triton(workers=1):
        _launch(x, out, 2.0)
    assert (out == -1.0).all()
    _launch(x, out, 2.0)
    torch.testing.assert_close(out, x * 2.0)


@gpu
def test_a_cached_launch_is_captured_by_a_cuda_graph() -> None:
    """A CUDA graph captures a cached launch on the capture stream; a replay reads the
    buffer's new contents."""
    x = torch.arange(64, dtype=torch.float32, device=DEVICE)  # [64]
    out = torch.empty_like(x)
    for _ in range(2):
        _launch(x, out, 2.0)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        _launch(x, out, 2.0)
    torch.cuda.current_stream().wait_stream(stream)
    x.copy_(torch.arange(64, 128, dtype=torch.float32, device=DEVICE))
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, x * 2.0)
