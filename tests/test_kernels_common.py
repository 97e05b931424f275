"""Shared setup of the kernel tests (tests/test_kernels_*.py) and kernels/_common.py's checks.

The kernel tests run on CUDA when a device is present; otherwise on CPU under the Triton
interpreter (TRITON_INTERPRET=1, set here before any kernels/ module defines its
@triton.jit functions), on small shapes and in fp32/fp16 (the interpreter rounds bf16 by
truncation, the GPU to nearest). Tests marked gpu need CUDA: large and Llama-shaped inputs,
64-bit offsets. Oracle for every kernel: its *_ref, the engine's torch path written in plain
torch beside the kernel (kernels/ imports nothing from engine/; each test file checks the
ref equals the engine's path), or for the GGUF kernels the engine's dequantize called from
the tests.
Mirrors vLLM 0.33 tests/kernels/allclose_default.py (default tolerances).
"""

from __future__ import annotations

import os

import pytest
import torch

ON_CUDA = torch.cuda.is_available()
if not ON_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="kernels/ need triton (pip install triton)")
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from libvllm.engine.entrypoints.openai.errors import error_response  # noqa: E402
from libvllm.engine.errors import InvalidArgumentError, UnsupportedError, VllmError  # noqa: E402
from libvllm.kernels._common import (  # noqa: E402
    check,
    check_float,
    check_same_device,
    compiling,
    precompile_triton,
)
from libvllm.kernels.activation import _silu_and_mul_kernel  # noqa: E402

DEVICE = "cuda" if ON_CUDA else "cpu"
if not ON_CUDA and type(_silu_and_mul_kernel.fn).__name__ != "InterpretedFunction":
    pytest.skip("no CUDA device and kernels/ were compiled without TRITON_INTERPRET=1",
                allow_module_level=True)
# dtypes the kernels are tested in on this machine
DTYPES = [torch.float16, torch.bfloat16, torch.float32] if ON_CUDA else [torch.float32,
                                                                         torch.float16]


def gpu(fn):
    """Mark a test gpu and skip it without a CUDA device."""
    return pytest.mark.gpu(pytest.mark.skipif(not ON_CUDA, reason="needs a CUDA device")(fn))


def cuda_only(*values, why: str):
    """A parametrization case marked gpu and skipped without CUDA: under the interpreter it
    is among the slowest and repeats paths that CPU cases run (`why` names them and the
    issue)."""
    return pytest.param(*values, marks=[pytest.mark.gpu, pytest.mark.skipif(
        not ON_CUDA, reason=f"interpreter-heavy case; covered on CUDA: {why}")])



ATOL = {torch.float16: 1e-3, torch.bfloat16: 1e-3, torch.float32: 1e-5}
RTOL = {torch.float16: 1e-3, torch.bfloat16: 1.6e-2, torch.float32: 1.3e-6}


def assert_close(actual: torch.Tensor, expected: torch.Tensor, atol: float | None = None,
                 rtol: float | None = None) -> None:
    torch.testing.assert_close(actual, expected, atol=ATOL[expected.dtype] if atol is None
                               else atol, rtol=RTOL[expected.dtype] if rtol is None else rtol)


def one_row_gemv_on_cpu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> bool:
    """engine/layers/linear.py _one_row_gemv without its CUDA and dtype conditions: the layer
    tests of the batch-1 decode folds patch it in to run them under the interpreter."""
    return (x.dim() == 2 and x.shape[0] == 1 and x.stride(1) == 1 and w.dtype == x.dtype
            and w.is_contiguous())


def decode_metadata(positions: list[int], block_size: int):
    """AttentionMetadata of one request decoding len(positions) tokens at the end of its
    context; block table [1, 3]: position p goes to slot (1 or 3) * block_size + p %
    block_size."""
    from libvllm.engine.layers.attention import AttentionMetadata

    n, seq_len = len(positions), positions[-1] + 1
    bt = torch.tensor([[1, 3]], dtype=torch.int32, device=DEVICE)
    slots = torch.tensor([int(bt[0, p // block_size]) * block_size + p % block_size
                          for p in positions], device=DEVICE)
    return AttentionMetadata(n, slots, [0, n], [seq_len], bt,
                             torch.tensor([0, n], dtype=torch.int32, device=DEVICE),
                             torch.tensor([seq_len], dtype=torch.int32, device=DEVICE),
                             n, seq_len)


def spy_calls(monkeypatch, module, name: str, record) -> None:
    """Replace module.name by a wrapper that calls record(*args, **kw), then the original."""
    fn = getattr(module, name)

    def wrapper(*args, **kw):
        record(*args, **kw)
        return fn(*args, **kw)

    monkeypatch.setattr(module, name, wrapper)


def fold_switch(monkeypatch, env: str, enabled, on: bool) -> None:
    """A batch-1 fold on (env unset) or off (env=1); `enabled` is its functools.cache'd
    reader, cleared so the next call reads the new value."""
    if on:
        monkeypatch.delenv(env, raising=False)
    else:
        monkeypatch.setenv(env, "1")
    enabled.cache_clear()


def run_without_host_sync(step):
    """step() once (compiles), then again with any host synchronization an error (torch's
    sync debug mode): what a decode step inside a CUDA graph must satisfy."""
    step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        return step()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def capture(step):
    """step() warmed up on a side stream, then captured in a CUDA graph (as the model
    runner captures): (the graph, step's output tensors that each replay rewrites)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    return graph, out


def tiny_model(cls, cfg) -> torch.nn.Module:
    """cls(cfg) on DEVICE in eval mode, seeded: matrices N(0, 0.2), vectors (norm weights,
    biases) U(0.5, 1.5)."""
    torch.manual_seed(0)
    model = cls(cfg).to(DEVICE)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2) if p.dim() > 1 else p.uniform_(0.5, 1.5)
    return model.eval()


def test_check_raises_invalid_argument() -> None:
    check(True, "unused")
    with pytest.raises(InvalidArgumentError, match="bad shape"):
        check(False, "bad shape")


def test_check_float_names_the_dtype() -> None:
    check_float("x", torch.zeros(1, dtype=torch.bfloat16))
    with pytest.raises(InvalidArgumentError, match="x must be float32.*torch.int64"):
        check_float("x", torch.zeros(1, dtype=torch.int64))


def test_check_same_device() -> None:
    check_same_device(a=torch.zeros(1), b=torch.zeros(1))
    with pytest.raises(InvalidArgumentError, match="a, b must be on one device"):
        check_same_device(a=torch.zeros(1), b=torch.zeros(1, device="meta"))


def test_kernel_errors_are_the_engines() -> None:
    """kernels/errors.py defines the classes engine/errors.py re-exports, so a launcher's
    error carries the engine's vllm.h status (capi/plumbing.py maps VllmError.status) and
    the OpenAI layer's HTTP status: 400 for a bad argument, 501 for an unsupported type."""
    import libvllm.kernels.errors

    errors = libvllm.kernels.errors
    assert (errors.VllmError, errors.InvalidArgumentError,
            errors.UnsupportedError) == (VllmError, InvalidArgumentError, UnsupportedError)
    with pytest.raises(InvalidArgumentError) as bad:
        check(False, "bad shape")
    assert bad.value.status == 1 and error_response(bad.value)[0] == 400
    assert UnsupportedError("no kernel").status == 4
    assert error_response(UnsupportedError("no kernel"))[0] == 501


@triton.jit
def _fill_kernel(out_ptr, n, VALUE: tl.constexpr, BLOCK: tl.constexpr, FAIL: tl.constexpr = False):
    tl.static_assert(not FAIL, "asked to fail")
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + i, VALUE, mask=i < n)


@pytest.mark.skipif(ON_CUDA, reason="the interpreter's case; CUDA runs the test below")
def test_precompile_triton_changes_nothing_under_the_interpreter() -> None:
    out = torch.zeros(100)  # [100]
    with precompile_triton(workers=2):
        assert not compiling()  # the interpreter's launches run
        _fill_kernel[(4,)](out, 100, VALUE=2.0, BLOCK=32)
    assert (out == 2.0).all()


@gpu
def test_precompile_triton_compiles_and_launches_nothing(triton_compiles) -> None:
    """A launch inside precompile_triton compiles its variant (on the pool) and writes
    nothing, while another thread's launch runs; after it, the same launches compile
    nothing and run. A compile error comes out at the exit, and leaves Triton usable."""
    import threading

    from triton.runtime.jit import JITFunction

    run = JITFunction.run
    out = torch.zeros(100, device=DEVICE)  # [100]
    other = torch.zeros(100, device=DEVICE)  # [100]
    with precompile_triton(workers=2):
        for value in (1.0, 2.0):
            _fill_kernel[(4,)](out, 100, VALUE=value, BLOCK=32)
        thread = threading.Thread(
            target=lambda: _fill_kernel[(4,)](other, 100, VALUE=3.0, BLOCK=32))
        thread.start()
        thread.join()
    assert JITFunction.run is run and len(triton_compiles) == 3
    assert not out.any() and (other == 3.0).all()
    triton_compiles.clear()
    for value in (1.0, 2.0):
        _fill_kernel[(4,)](out, 100, VALUE=value, BLOCK=32)
        assert (out == value).all()
    assert triton_compiles == []
    for _ in range(2):  # a failed compile leaves nothing behind: the second one fails too
        with pytest.raises(Exception, match="asked to fail"):
            with precompile_triton(workers=2):
                _fill_kernel[(4,)](out, 100, VALUE=4.0, BLOCK=32, FAIL=True)
    assert JITFunction.run is run
    with precompile_triton(workers=2):
        _fill_kernel[(4,)](out, 100, VALUE=5.0, BLOCK=32)
    _fill_kernel[(4,)](out, 100, VALUE=5.0, BLOCK=32)
    assert (out == 5.0).all()


@gpu
def test_precompile_triton_asks_for_a_variant_once(monkeypatch) -> None:
    """Inside precompile_triton the pending compile stays in the kernel's cache, so launching
    one variant again does not go back to Triton's compile path (where Triton 3.6 hashed
    the kernel's source for every launch: ~10 s over a Llama-8B capture pass)."""
    import triton

    asked: list[str] = []
    monkeypatch.setattr(triton.knobs.runtime, "jit_cache_hook",
                        lambda **kw: asked.append(kw["repr"]) and None)
    out = torch.zeros(100, device=DEVICE)  # [100]
    with precompile_triton(workers=2):
        for _ in range(3):
            _fill_kernel[(4,)](out, 100, VALUE=6.0, BLOCK=64)
    assert len(asked) == 1 and not out.any()
    _fill_kernel[(4,)](out, 100, VALUE=6.0, BLOCK=64)
    assert len(asked) == 1 and (out == 6.0).all()


@gpu
def test_compile_only_expert_ids_are_valid_indices() -> None:
    """Inside precompile_triton the top-k launch is skipped, so its ids are zero-filled
    (compiling()): the torch alignment past its pair limit (16,384 pairs here, a 2,048-token
    step of a top-8 model) and the torch experts index with them. Memory the allocator
    hands back is filled with out-of-range ids first, so skipped memory would show."""
    import threading

    from libvllm.kernels.moe_align_block_size import moe_align_block_size
    from libvllm.kernels.moe_topk_softmax import topk_softmax

    garbage = [torch.full((2048, 8), 1 << 30, dtype=torch.int32, device=DEVICE)
               for _ in range(2)]  # the sizes of topk_softmax's weights and ids
    del garbage  # their blocks go back to the cache, where torch.empty finds them
    logits = torch.randn(2048, 128, device=DEVICE)  # [M, E]
    seen = []
    with precompile_triton(workers=2):
        _, ids = topk_softmax(logits, 8, True)
        thread = threading.Thread(target=lambda: seen.append(compiling()))
        thread.start()
        thread.join()
        assert compiling() and seen == [False]
        assert (ids == 0).all()
        sorted_ids, _, post_pad = moe_align_block_size(ids, 64, 128)
        assert post_pad.item() == 16384 and sorted_ids[:16384].sort().values.tolist() == \
            list(range(16384))
    assert not compiling()
    _, ids = topk_softmax(logits, 8, True)
    assert ids.max().item() < 128 and (ids != 0).any()
