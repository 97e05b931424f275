"""vllm_engine_free gives the engine's memory back: 10 cycles of create / one greedy
request / free in a C program (tests/c/engine_cycles.c, SmolLM2) leave the resident set
after the 10th free within 10% of the one after the first (capi/release.py: gc, CUDA's
empty_cache, malloc_trim): the layers sit in reference cycles through their parameters'
weight_loader (as in vLLM), so without a collection and a trim each cycle adds about an
engine. Oracle: /proc/self/status VmRSS. Upstream: vLLM frees with gc.collect() and
empty_cache in cleanup_dist_env_and_memory (vllm/distributed/parallel_state.py).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.test_capi_stream import open_library

ROOT = Path(__file__).resolve().parent.parent
CYCLES = 10

pytestmark = [pytest.mark.capi, pytest.mark.slow]

api = pytest.fixture(scope="module")(open_library)


def test_ten_engine_cycles_keep_the_resident_set(compile_c, model_path, child_env):
    exe = compile_c(ROOT / "tests/c/engine_cycles.c")
    run = subprocess.run([str(exe), model_path, str(CYCLES)], capture_output=True, text=True,
                         env=child_env, timeout=900)
    assert run.returncode == 0, run.stderr
    rss = [int(kb) for kb in re.findall(r"^cycle \d+ rss (\d+)$", run.stdout, re.M)]
    assert len(rss) == CYCLES, run.stdout
    assert rss[-1] <= rss[0] * 1.10, rss


@pytest.mark.gpu
def test_ten_engine_cycles_give_cuda_memory_back(api, model_path):
    """The same cycles with the core in this process on CUDA: the caching allocator's
    reserved memory after the 10th free is within 10% (+ 64 MiB not tied to an engine) of
    the one after the first."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    ffi, lib = api.ffi, api.lib
    reserved = []
    for _ in range(CYCLES):
        engine = api.create(model_path, device="cuda", multiprocessing=-1)
        sp = ffi.new("vllm_sampling_params *")
        lib.vllm_sampling_params_init(sp, ffi.sizeof(sp[0]))
        sp.temperature, sp.max_tokens = 0.0, 16
        api.ok(lib.vllm_request_add(engine, b"r", b"The capital of France is", ffi.NULL, 0, sp))
        out, n, left = (ffi.new("vllm_request_output **"), ffi.new("size_t *"),
                        ffi.new("size_t *"))
        left[0] = 1
        while left[0]:
            api.ok(lib.vllm_engine_step(engine, out, n))
            api.ok(lib.vllm_engine_num_unfinished(engine, left))
        lib.vllm_engine_free(engine)
        reserved.append(torch.cuda.memory_reserved())
    assert reserved[-1] <= reserved[0] * 1.10 + (64 << 20), reserved
