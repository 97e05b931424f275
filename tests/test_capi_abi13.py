"""vllm.h 1.3 through build/libvllm.so loaded into this process (as
tests/test_capi_stream.py): the quantization / cache-dtype engine params, model info's
weight format, vllm_engine_check_health, vllm_engine_reset_prefix_cache,
vllm_sampling_params.use_generation_config and the version rule.

Oracles: vLLM's messages for invalid values (engine/config.py, vllm/config/cache.py),
the prefix-cache hit counter (vllm:prefix_cache_hits: a repeated prompt hits, and after a
reset it does not), the engine's own greedy tokens (top_k = 1 from generation_config.json
picks the argmax), the GGUF's general.file_type (llama.cpp's llama_ftype), the header's
ABI macros and build/libvllm.pc. Mirrors vLLM 0.33 tests/v1/core/test_prefix_caching.py
(test_reset_prefix_cache), tests/entrypoints/openai/test_serving_chat.py (generation
config defaults) and the /health contract of vllm/entrypoints/serve/instrumentator.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import tomllib
from test_capi_engine_core import _core_children
from test_capi_stream import open_library
from test_dummy_loader import write_config

from libvllm import engine
from libvllm.capi.header import ROOT, abi_version

pytestmark = [pytest.mark.capi]
api = pytest.fixture(scope="module")(open_library)

PROMPT_IDS = list(range(3, 43))  # 40 tokens: two full 16-token blocks to cache


@pytest.fixture
def dummy(tmp_path) -> str:
    """A tiny Llama directory (random weights, no tokenizer) with a generation_config."""
    path = write_config(tmp_path, "LlamaForCausalLM")
    (Path(path) / "generation_config.json").write_text(
        json.dumps({"top_k": 1, "max_new_tokens": 5}))
    return path


def _create(api, path: str, **fields):
    return api.create(path, load_format="dummy", skip_tokenizer_init=1, device="cpu", **fields)


def _sampling(api, **fields):
    sp = api.ffi.new("vllm_sampling_params *")
    api.lib.vllm_sampling_params_init(sp, api.ffi.sizeof(sp[0]))
    sp.ignore_eos = 1
    for name, value in fields.items():
        setattr(sp, name, value)
    return sp


def _step_tokens(api, e, sp, ids=PROMPT_IDS, rid=b"r") -> list[int]:
    lib, ffi = api.lib, api.ffi
    api.ok(lib.vllm_request_add(e, rid, ffi.NULL, ffi.new("int32_t[]", ids), len(ids), sp))
    outs, n, left = ffi.new("vllm_request_output **"), ffi.new("size_t *"), ffi.new(
        "size_t *", 1)
    tokens = []
    while left[0]:
        api.ok(lib.vllm_engine_step(e, outs, n))
        for i in range(n[0]):
            tokens += list(outs[0][i].token_ids[0:outs[0][i].n_token_ids])
        api.ok(lib.vllm_engine_num_unfinished(e, left))
    return tokens


def _hits(api, e) -> int:
    m = api.ffi.new("vllm_metrics *", {"struct_size": api.ffi.sizeof("vllm_metrics")})
    api.ok(api.lib.vllm_engine_metrics(e, m))
    return m.prefix_cache_hits


def _info(api, e):
    info = api.ffi.new("vllm_model_info *", {"struct_size": api.ffi.sizeof("vllm_model_info")})
    api.ok(api.lib.vllm_engine_model_info(e, info))
    return info


def _text(api, ptr) -> str | None:
    return None if ptr == api.ffi.NULL else api.ffi.string(ptr).decode()


# --------------------------------------------------------------------------- init defaults


def test_init_defaults_and_old_sizes(api):
    ffi, lib = api.ffi, api.lib
    p = ffi.new("vllm_engine_params *")
    lib.vllm_engine_params_init(p, ffi.sizeof(p[0]))
    for name in ("quantization", "kv_cache_dtype", "mamba_cache_dtype",
                 "mamba_ssm_cache_dtype", "mamba_cache_mode"):
        assert getattr(p, name) == ffi.NULL, name  # NULL: vLLM's default
    assert p.calculate_kv_scales == 0
    sp = ffi.new("vllm_sampling_params *")
    lib.vllm_sampling_params_init(sp, ffi.sizeof(sp[0]))
    assert sp.use_generation_config == 0
    # a 1.2 caller's struct ends before the 1.3 fields: nothing past its size is written
    old = ffi.offsetof("vllm_engine_params", "quantization")
    raw = ffi.new("char[]", ffi.sizeof("vllm_engine_params"))
    ffi.memmove(raw + old, b"\xab" * (len(raw) - old), len(raw) - old)
    lib.vllm_engine_params_init(ffi.cast("vllm_engine_params *", raw), old)
    assert ffi.cast("vllm_engine_params *", raw).struct_size == old
    assert bytes(ffi.buffer(raw)[old:]) == b"\xab" * (len(raw) - old)


@pytest.mark.parametrize("field, value, message", [
    ("quantization", "awq", "Unknown quantization method: 'awq'"),
    ("kv_cache_dtype", "fp8_e5m2", "Invalid kv_cache_dtype: 'fp8_e5m2'"),
    ("mamba_cache_dtype", "fp8", "mamba_cache_dtype must be one of"),
    ("mamba_ssm_cache_dtype", "int8", "mamba_ssm_cache_dtype must be one of"),
    ("mamba_cache_mode", "all", "mamba_cache_mode must be none or align"),
])
def test_invalid_values_fail_create_with_the_engines_message(api, dummy, field, value, message):
    p, _keep = api.params(load_format="dummy", skip_tokenizer_init=1, **{field: value})
    out = api.ffi.new("vllm_engine **")
    api.ok(api.lib.vllm_engine_create(dummy.encode(), p, out), api.lib.VLLM_ERR_INVALID_ARGUMENT)
    assert message in api.error() and out[0] == api.ffi.NULL


def test_valid_values_and_model_info_weight_format(api, dummy):
    """"" is NULL (the checkpoint's quantization: none here); the KV cache dtype in use
    is the model's on CPU (float32) with "auto"."""
    e = _create(api, dummy, quantization="", kv_cache_dtype="auto", calculate_kv_scales=1,
                mamba_cache_dtype="float32", mamba_ssm_cache_dtype="bfloat16",
                mamba_cache_mode="none")
    try:
        info = _info(api, e)
        assert info.quantization == api.ffi.NULL
        assert _text(api, info.kv_cache_dtype) == _text(api, info.dtype) == "float32"
    finally:
        api.lib.vllm_engine_free(e)


@pytest.mark.slow
def test_gguf_weight_format_is_its_file_type(api, model_path):
    from libvllm.engine.gguf.reader import GGUFReader

    with GGUFReader(model_path) as r:
        file_type = r.metadata["general.file_type"]
    e = api.create(model_path)
    try:
        info = _info(api, e)
        # llama.cpp's LLAMA_FTYPE_MOSTLY_Q4_1 = 3, LLAMA_FTYPE_MOSTLY_Q4_K_M = 15
        want = {3: "gguf:Q4_1", 15: "gguf:Q4_K_M"}[file_type]
        assert _text(api, info.quantization) == want
        assert _text(api, info.kv_cache_dtype) == _text(api, info.dtype)
    finally:
        api.lib.vllm_engine_free(e)


# --------------------------------------------------------------------------- prefix cache


def test_reset_prefix_cache_recomputes_a_cached_prompt(api, dummy):
    e = _create(api, dummy)
    try:
        sp = _sampling(api, max_tokens=2)
        _step_tokens(api, e, sp, rid=b"a")
        assert _hits(api, e) == 0
        _step_tokens(api, e, sp, rid=b"b")
        assert _hits(api, e) == 32  # two full blocks of the repeated prompt
        api.ok(api.lib.vllm_engine_reset_prefix_cache(e))
        _step_tokens(api, e, sp, rid=b"c")
        assert _hits(api, e) == 32  # nothing hit after the reset
        _step_tokens(api, e, sp, rid=b"d")
        assert _hits(api, e) == 64  # cached again
    finally:
        api.lib.vllm_engine_free(e)


def test_reset_refused_while_a_request_holds_blocks(api, dummy):
    lib, ffi = api.lib, api.ffi
    e = _create(api, dummy)
    try:
        ids = ffi.new("int32_t[]", PROMPT_IDS)
        api.ok(lib.vllm_request_add(e, b"run", ffi.NULL, ids, len(PROMPT_IDS),
                                    _sampling(api, max_tokens=8)))
        outs, n = ffi.new("vllm_request_output **"), ffi.new("size_t *")
        api.ok(lib.vllm_engine_step(e, outs, n))  # running: it holds its blocks
        api.ok(lib.vllm_engine_reset_prefix_cache(e), lib.VLLM_ERR_INVALID_STATE)
        assert "running requests hold KV blocks" in api.error()
        api.ok(lib.vllm_request_abort(e, b"run"))
        api.ok(lib.vllm_engine_step(e, outs, n))
        api.ok(lib.vllm_engine_reset_prefix_cache(e))
        api.ok(lib.vllm_engine_reset_prefix_cache(ffi.NULL), lib.VLLM_ERR_INVALID_ARGUMENT)
    finally:
        lib.vllm_engine_free(e)
    api.ok(lib.vllm_engine_reset_prefix_cache(e), lib.VLLM_ERR_INVALID_HANDLE)


# --------------------------------------------------------------------------- health


def _session(api, e):
    """The engine's session inside the library (this process runs its Python side)."""
    return sys.modules["libvllm.capi.plumbing"].engines[int(api.ffi.cast("uintptr_t", e))].session


def test_check_health_in_process_never_waits_for_the_engine_lock(api, dummy):
    lib = api.lib
    e = _create(api, dummy, multiprocessing=-1)
    try:
        api.ok(lib.vllm_engine_check_health(e))
        api.ok(lib.vllm_engine_start_loop(e))
        api.ok(lib.vllm_engine_check_health(e))
        held, release = threading.Event(), threading.Event()

        def hold_the_lock():
            with _session(api, e).lock:
                held.set()
                release.wait(60)

        holder = threading.Thread(target=hold_the_lock)
        holder.start()
        held.wait(60)
        results = []
        checker = threading.Thread(target=lambda: results.append(lib.vllm_engine_check_health(e)))
        checker.start()
        checker.join(60)
        release.set()
        holder.join(60)
        assert results == [lib.VLLM_OK]  # answered while another thread held the lock
    finally:
        lib.vllm_engine_free(e)
    api.ok(lib.vllm_engine_check_health(e), lib.VLLM_ERR_INVALID_HANDLE)


def test_check_health_after_the_in_process_loop_failed(api, dummy):
    """A step that raises ends the background loop (AsyncLLM): the engine is dead."""
    lib, ffi = api.lib, api.ffi
    e = _create(api, dummy, multiprocessing=-1)
    try:
        api.ok(lib.vllm_engine_start_loop(e))
        engine = _session(api, e).engine

        def failing_step():
            raise RuntimeError("injected step failure")

        engine.step = failing_step  # the instance attribute shadows LLMEngine.step
        request = ffi.new("vllm_request **")
        ids = ffi.new("int32_t[]", PROMPT_IDS)
        api.ok(lib.vllm_request_submit(e, b"x", ffi.NULL, ids, len(PROMPT_IDS),
                                       _sampling(api, max_tokens=2), ffi.NULL, ffi.NULL,
                                       request))
        events = api.pull_all(request[0])  # its last event is the failure
        lib.vllm_request_free(request[0])
        assert events[-1]["finish_reason"] == lib.VLLM_FINISH_ERROR
        api.ok(lib.vllm_engine_check_health(e), lib.VLLM_ERR_ENGINE_DEAD)
        assert api.error()  # the reason (the engine's check_health may word it as vLLM's)
    finally:
        lib.vllm_engine_free(e)


@pytest.mark.slow
def test_check_health_and_reset_with_a_child_core_then_sigkill(api, dummy):
    lib = api.lib
    e = _create(api, dummy, multiprocessing=1)
    try:
        (core,) = _core_children()
        api.ok(lib.vllm_engine_check_health(e))
        sp = _sampling(api, max_tokens=2)
        _step_tokens(api, e, sp, rid=b"a")
        _step_tokens(api, e, sp, rid=b"b")
        assert _hits(api, e) == 32
        api.ok(lib.vllm_engine_reset_prefix_cache(e))  # a utility call to the child
        _step_tokens(api, e, sp, rid=b"c")
        assert _hits(api, e) == 32
        api.ok(lib.vllm_engine_start_loop(e))
        api.ok(lib.vllm_engine_check_health(e))
        os.kill(core, signal.SIGKILL)
        deadline = time.monotonic() + 60  # a bound on the wait, not a timing claim
        while (status := lib.vllm_engine_check_health(e)) == lib.VLLM_OK and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        assert status == lib.VLLM_ERR_ENGINE_DEAD, api.name(status)
        assert api.error()  # the reason, e.g. "engine dead: the engine core process died"
        assert api.name(status) == "VLLM_ERR_ENGINE_DEAD"
    finally:
        lib.vllm_engine_free(e)


# --------------------------------------------------------------------------- generation config


def test_use_generation_config_applies_the_models_defaults(api, dummy):
    """generation_config.json: top_k 1 (argmax) and max_new_tokens 5."""
    e = _create(api, dummy)
    try:
        greedy = _step_tokens(api, e, _sampling(api, temperature=0.0, max_tokens=5), rid=b"g")
        assert len(greedy) == 5
        on = _step_tokens(api, e, _sampling(api, use_generation_config=1), rid=b"on")
        assert on == greedy  # top_k 1 at temperature 1 is the argmax; 5 tokens
        off = _step_tokens(api, e, _sampling(api), rid=b"off")
        assert len(off) == 16  # vLLM's max_tokens
        mine = _step_tokens(api, e, _sampling(api, use_generation_config=1, max_tokens=3),
                            rid=b"mine")
        assert mine == greedy[:3]  # a field the caller set keeps its value
        api.ok(api.lib.vllm_engine_start_loop(e))
        request = api.ffi.new("vllm_request **")
        ids = api.ffi.new("int32_t[]", PROMPT_IDS)
        api.ok(api.lib.vllm_request_submit(
            e, b"loop", api.ffi.NULL, ids, len(PROMPT_IDS), _sampling(
                api, use_generation_config=1), api.ffi.NULL, api.ffi.NULL, request))
        events = api.pull_all(request[0])
        api.lib.vllm_request_free(request[0])
        assert [t for ev in events for t in ev["tokens"]] == greedy
    finally:
        api.lib.vllm_engine_free(e)


# --------------------------------------------------------------------------- version


def test_version_is_abi_major_minor_and_the_package_version(api, built):
    major, minor = abi_version()
    version = api.ffi.string(api.lib.vllm_version()).decode()
    assert version == f"{major}.{minor}.0" == engine.__version__
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "libvllm.engine.__version__"}
    modversion = subprocess.run(
        ["pkg-config", "--modversion", "libvllm"], capture_output=True, text=True,
        env={**os.environ, "PKG_CONFIG_PATH": str(built)}, check=True).stdout.strip()
    assert modversion == version


@pytest.mark.parametrize("configured, kv, is_gguf, want", [
    (None, {}, False, None),
    (None, {"quantization_config": {"quant_method": "fp8"}}, False, "fp8"),
    (None, {"quantization_config": {"quant_method": "compressed-tensors"}}, False,
     "compressed-tensors"),
    ("fp8", {}, False, "fp8"),  # vLLM's --quantization fp8 on an unquantized checkpoint
    (None, {"general.file_type": 15}, True, "gguf:Q4_K_M"),
    (None, {}, True, "gguf"),  # no general.file_type
], ids=["none", "fp8-ckpt", "compressed-tensors", "online-fp8", "gguf", "gguf-untyped"])
def test_weight_format_names(configured, kv, is_gguf, want):
    from libvllm.engine.session import weight_format

    assert weight_format.quantization(configured, kv, is_gguf) == want
    assert weight_format.kv_cache_dtype("auto", "bfloat16") == "bfloat16"
    assert weight_format.kv_cache_dtype("fp8_e4m3", "bfloat16") == "fp8_e4m3"
