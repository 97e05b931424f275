"""Shared pytest fixtures: the test model, the built library and CLI, C compilation.

model_path: env VLLM_TEST_MODEL, else the model `make run` fetches; skips if absent.
hf_test_tokenizer / hf_test_model: transformers' tokenizer and fp32 model of that GGUF
(the oracles of several modules), loaded once a session; tests only read them.
built: runs `make -s build/libvllm.so build/vllm-cli` once per session (per worker).
child_env / compile_c: run C programs as a user would (PYTHONUNBUFFERED unset: it
would hide lost output of the embedded interpreter).
The test process and its children run torch on one intra-op thread (_one_torch_thread).
Parallel runs (pytest-xdist, `-n auto` in pyproject's addopts): the worker count
(pytest_xdist_auto_num_workers) and a module's tests kept on one worker
(pytest_xdist_make_scheduler).
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _interpret_kernels_without_cuda() -> None:
    """Without CUDA the kernels/ tests run under the Triton interpreter, which must be on
    before any test module imports a kernels/ module (engine layers import them too): a
    module defined without it mixes compiled and interpreted @triton.jit functions."""
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    if os.environ.get("TRITON_INTERPRET") == "1":
        _interpret_without_dead_overflow_checks()


def _interpret_without_dead_overflow_checks() -> None:
    """The interpreter runs with debug off, where every device_assert returns at once
    (triton.language.semantic device_assert); its integer-overflow sanitizer still builds
    each check (the int64 op and both bounds) for every int add, sub and mul, then hands it
    to that no-op assert: about half the time of an index-heavy kernel (a GGUF GEMV here:
    13.7 s -> 6.1 s). Off while debug is off, nothing that runs changes."""
    import dataclasses

    try:
        from triton.runtime import interpreter
    except ImportError:  # no triton: the kernel tests skip
        return
    options = getattr(getattr(interpreter, "interpreter_builder", None), "options", None)
    if options is not None and not options.debug and getattr(options, "sanitize_overflow", False):
        interpreter.interpreter_builder.options = dataclasses.replace(
            options, sanitize_overflow=False)


_interpret_kernels_without_cuda()


def _one_torch_thread() -> None:
    """One intra-op thread for the test process and, through OMP_NUM_THREADS, for every
    child it starts (engine cores, servers, C programs, examples), unless OMP_NUM_THREADS
    says otherwise: their ops are small (tiny models, batches of a few rows), and on a
    2-core box shared with another process (an xdist worker, a child, another job) a
    second thread turns every parallel region into a wait for a descheduled thread
    (measured here: tests/test_capi_abi1.py 22.6 s -> 12.7 s beside one busy process;
    tests/test_engine_core_proc.py + test_capi_async_llm.py on two workers 219 s -> 42 s
    with one-thread children). tests/test_capi_host_runtime.py's n_threads test unsets it
    for its child, which then starts with torch's default."""
    import torch

    if "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


_one_torch_thread()


def _small_cpu_kv_cache() -> None:
    """A 1 GiB cap on the CPU KV cache for this process and every child it starts
    (VLLM_CPU_KVCACHE_SPACE, vLLM's name; unset it is 4 GiB), unless set already: the
    cache is zeroed at start-up, so resident from the start, and two workers' engines, CLIs
    and servers at 4 GiB each outgrew the 24 GiB machine (a worker was OOM-killed)."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


_small_cpu_kv_cache()


def _sigint_at_default_for_children() -> None:
    """A test process started as a background job of a non-interactive shell inherits
    SIGINT ignored, and every program it starts would too (exec keeps an ignored signal);
    with a handler installed here they start with SIGINT at its default (exec resets a
    handled signal), as from an interactive shell: the C hosts and servers that tests
    interrupt need it."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


_sigint_at_default_for_children()
MAX_WORKERS = 2  # measured: the 2-core CI machine; more workers are untested


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto`: one worker a usable core (at most MAX_WORKERS) on a machine without CUDA.
    Serial (0) with CUDA, where the GPU tests size their KV caches from the free device
    memory of one shared device, and for a run of one file, whose tests stay on one worker
    anyway. `-n N` on the command line overrides this."""
    import torch

    files = {arg.split("::")[0] for arg in config.args}
    if torch.cuda.is_available() or len(files) == 1 and Path(next(iter(files))).is_file():
        return 0
    return min(len(os.sched_getaffinity(0)), MAX_WORKERS)


# Modules run together as one unit of work (on one worker, one after another): "timing",
# those that assert wall-clock bounds (a render budget, a GIL gap, an abort within 1 s, a
# case within 5 s, a death noticed within 5 s), so that no two of them run at once, and the
# other users of hf_test_tokenizer beside test_chat_template, so that one worker loads it;
# "hf_test_model", the users of that session fixture, so that one worker loads it.
SHARED_UNITS = {
    "timing": ("test_chat_template", "test_hostile_prompt_limits", "test_hostile_server",
               "test_gguf_fuzz", "test_capi_engine_core", "test_engine_core_proc",
               "test_tokenizer", "test_tokenizer_hf_dir"),
    "hf_test_model": ("test_generate_parity", "test_sampling_e2e", "test_capi_embed",
                      "test_pooling_server", "test_cli_embed"),
}
UNIT_OF_MODULE = {m: unit for unit, modules in SHARED_UNITS.items() for m in modules}
# About the seconds a scope (a module or unit) takes on the 2-core machine with two workers,
# for those over ~10 s: an idle worker takes the longest scope left, so that the run ends on
# short ones and both workers finish together (longest processing time first; xdist hands
# them out by test count). Other scopes count 0.05 s a test.
SCOPE_SECONDS = {
    "hf_test_model": 115, "test_openai_structured": 111, "test_kernels_gguf_mmvq": 82,
    "timing": 80, "test_kernels_fused_moe_gemv": 80, "test_kernels_cudagraph_runner": 76,
    "test_kernels_paged_attention": 75, "test_examples": 65, "test_cli": 59,
    "test_tensor_parallel": 48, "test_async_scheduling": 48, "test_hybrid_gdn_engine": 44,
    "test_layers_qkv_rope_fold": 41, "test_kernels_gguf_gemm": 40,
    "test_kernels_gemv_rope_cache": 38, "test_capi_threads": 36, "test_server": 33,
    "test_kernels_moe_align": 29, "test_kernels_chunk_gated_delta_rule": 28,
    "test_capi_async_llm": 28, "test_kernels_fused_moe": 27, "test_openai_api": 27,
    "test_tokenizer_spm": 26, "test_install_relocatable": 26, "test_capi": 25,
    "test_kernels_gemv": 25,
}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's scheduler by scope, a scope being a test module or one of SHARED_UNITS: a
    module's tests run in order on one worker, its module-scoped engines and models built
    once. (xdist's own `--dist loadgroup` cannot mark groups under pytest 9.)"""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return UNIT_OF_MODULE.get(Path(module).stem, module)

        def _assign_work_unit(self, node) -> None:
            def seconds(scope: str) -> float:
                return SCOPE_SECONDS.get(Path(scope).stem, 0.05 * len(self.workqueue[scope]))

            self.workqueue.move_to_end(max(self.workqueue, key=seconds), last=False)
            super()._assign_work_unit(node)

    return ModuleScheduling(config, log)


DEFAULT_MODEL = Path.home() / ".cache/libvllm/models/SmolLM2-135M-Instruct.Q4_1.gguf"
C_FLAGS = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic"]


@pytest.fixture(scope="session")
def model_path() -> str:
    path = Path(os.environ.get("VLLM_TEST_MODEL") or DEFAULT_MODEL)
    if not path.is_file():
        pytest.skip(f"test model {path} is absent (make run fetches it; or set VLLM_TEST_MODEL)")
    return str(path)


@pytest.fixture(scope="session")
def gguf_tokenizer(model_path):
    """The default model's tokenizer, from its GGUF metadata (read once per session)."""
    from libvllm.engine.gguf.reader import GGUFReader
    from libvllm.engine.tokenizer import Tokenizer

    with GGUFReader(model_path) as reader:
        return Tokenizer.from_gguf_metadata(reader.metadata)


@pytest.fixture(scope="session")
def hf_test_tokenizer(model_path):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(
        os.path.dirname(model_path), gguf_file=os.path.basename(model_path))


@pytest.fixture(scope="session")
def hf_test_model(model_path):
    """transformers parses the GGUF's metadata with the gguf package twice (the config, then
    the tensors: ~8 s each for a 49k-token vocabulary) and builds the tensor-name map of
    every layer again for each of its ~400 modules (~9 s): both are memoized while it loads,
    the same parse and the same maps, so the model is the one from_pretrained gives."""
    import functools

    import torch

    transformers = pytest.importorskip("transformers")
    gguf = pytest.importorskip("gguf")  # transformers' GGUF loader
    with pytest.MonkeyPatch.context() as patch:
        for name in ("GGUFReader", "get_tensor_name_map"):
            patch.setattr(gguf, name, functools.cache(getattr(gguf, name)))
        return transformers.AutoModelForCausalLM.from_pretrained(
            os.path.dirname(model_path), gguf_file=os.path.basename(model_path),
            dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def built() -> Path:
    """The build directory, with libvllm.so and vllm-cli up to date. Each xdist worker runs
    this: an exclusive lock on the Makefile keeps two makes from writing build/ at once."""
    with open(ROOT / "Makefile") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        make = subprocess.run(
            ["make", "-s", "build/libvllm.so", "build/vllm-cli"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
    assert make.returncode == 0, f"make failed:\n{make.stdout}\n{make.stderr}"
    return ROOT / "build"


@pytest.fixture(scope="session")
def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONUNBUFFERED", None)
    return env


@pytest.fixture(scope="session")
def compile_c(built, tmp_path_factory):
    """compile_c(source, *extra_flags) -> path of a program linked with -lvllm."""
    out_dir = tmp_path_factory.mktemp("c")

    def compile_program(source: Path, *extra: str) -> Path:
        exe = out_dir / source.stem
        cmd = [
            "cc",
            *C_FLAGS,
            f"-I{ROOT / 'include'}",
            str(source),
            "-o",
            str(exe),
            f"-L{built}",
            "-lvllm",
            f"-Wl,-rpath,{built}",
            *extra,
        ]
        cc = subprocess.run(cmd, capture_output=True, text=True)
        assert cc.returncode == 0, f"{' '.join(cmd)}\n{cc.stderr}"
        return exe

    return compile_program


@pytest.fixture
def triton_compiles(monkeypatch):
    """The kernels Triton compiles (or loads from its disk cache) in this process while the
    test runs, as repr strings, from triton.knobs.runtime's jit_post_compile_hook; a test
    clears the list where its counting starts."""
    import triton

    compiled: list[str] = []
    monkeypatch.setattr(triton.knobs.runtime, "jit_post_compile_hook",
                        lambda **kw: compiled.append(kw["repr"]))
    return compiled


@pytest.fixture(scope="module")
def in_process_core():
    """For modules that look inside the engine core (model runner, CUDA graphs, its memory
    profile): the core runs in process (CUDA's default is a child process). Use with
    `pytestmark = pytest.mark.usefixtures("in_process_core")`."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        yield
