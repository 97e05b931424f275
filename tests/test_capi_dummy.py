"""vllm.h 0.3 engine params load_format, skip_tokenizer_init and gpu_memory_utilization
(vLLM's --load-format dummy, --skip-tokenizer-init, --gpu-memory-utilization) and 0.4's
async_scheduling (--async-scheduling: the same tokens on, off and by default), through
build/libvllm.so loaded into this process, on a tiny Llama config.json directory.

Oracles: the engine itself (LLMEngine with the same config gives the same greedy tokens:
dummy weights are seeded), vLLM's message for a text prompt without a tokenizer, and the
status codes of the tokenizer functions and of the OpenAI layer on such an engine.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from libvllm.engine.sampling_params import SamplingParams
from tests.test_capi_stream import open_library
from tests.test_dummy_loader import dummy_engine, write_config

pytestmark = [pytest.mark.capi]
api = pytest.fixture(scope="module")(open_library)


def _step_tokens(api, engine, ids: list[int]) -> list[int]:
    lib, ffi = api.lib, api.ffi
    sp = api.greedy(6)
    api.ok(lib.vllm_request_add(engine, b"d", ffi.NULL, ffi.new("int32_t[]", ids), len(ids),
                                sp))
    outs, n, left = ffi.new("vllm_request_output **"), ffi.new("size_t *"), ffi.new(
        "size_t *", 1)
    tokens = []
    while left[0]:
        api.ok(lib.vllm_engine_step(engine, outs, n))
        for i in range(n[0]):
            assert ffi.string(outs[0][i].text) == b""
            tokens += list(outs[0][i].token_ids[0:outs[0][i].n_token_ids])
        api.ok(lib.vllm_engine_num_unfinished(engine, left))
    return tokens


def _oracle_tokens(path: str, ids: list[int]) -> list[int]:
    """Greedy tokens of LLMEngine on the same dummy weights (seeded)."""
    oracle = dummy_engine(path)
    oracle.add_request("o", ids, SamplingParams(temperature=0.0, max_tokens=6,
                                                ignore_eos=True))
    finals = []
    while oracle.has_unfinished_requests():
        finals += [o for o in oracle.step() if o.finished]
    return finals[0].outputs[0].token_ids


def test_dummy_engine_through_the_abi(api, tmp_path):
    path = write_config(tmp_path, "LlamaForCausalLM")
    lib, ffi = api.lib, api.ffi
    e = api.create(path, load_format="dummy", skip_tokenizer_init=1, device="cpu")
    try:
        want = _oracle_tokens(path, [1, 2, 3])
        assert _step_tokens(api, e, [1, 2, 3]) == want and len(want) == 6
        status = lib.vllm_request_add(e, b"t", b"hello", ffi.NULL, 0, api.greedy(2))
        assert status == lib.VLLM_ERR_INVALID_ARGUMENT
        assert "text prompts" in api.error() and "skip_tokenizer_init" in api.error()
        ids, n = ffi.new("int32_t[8]"), ffi.new("size_t *")
        assert lib.vllm_tokenize(e, b"hi", 2, 0, 1, ids, 8, n) == lib.VLLM_ERR_INVALID_STATE
        api.ok(lib.vllm_model_meta_count(e, n))  # the config.json keys (since 1.0)
        assert n[0] == len(json.loads((Path(path) / "config.json").read_text()))
        info = ffi.new("vllm_model_info *", {"struct_size": ffi.sizeof("vllm_model_info")})
        api.ok(lib.vllm_engine_model_info(e, info))
        assert info.n_params == -1 and info.n_layers >= 1 and info.chat_template == ffi.NULL
        body = json.dumps({"prompt": "hi", "max_tokens": 2}).encode()
        api.ok(lib.vllm_engine_start_loop(e))
        status_out, body_out = ffi.new("int32_t *"), ffi.new("char **")
        stream = ffi.new("vllm_openai_stream **")
        api.ok(lib.vllm_openai_request(e, b"POST", b"/v1/completions", body, status_out,
                                       body_out, stream))
        assert status_out[0] == 400 and b"skip_tokenizer_init" in ffi.string(body_out[0])
        lib.vllm_string_free(body_out[0])
    finally:
        lib.vllm_engine_free(e)


def test_model_info_eog_lists_the_generation_config_eos_ids(api, tmp_path):
    """vllm_model_info.eog_token_ids: "EOS and the model's generation_config stop tokens"
    (vllm.h), here generation_config.json's eos_token_id list (no tokenizer, so no EOS)."""
    path = write_config(tmp_path, "LlamaForCausalLM")
    (Path(path) / "generation_config.json").write_text(json.dumps({"eos_token_id": [9, 3]}))
    ffi, lib = api.ffi, api.lib
    e = api.create(path, load_format="dummy", skip_tokenizer_init=1, device="cpu")
    try:
        info = ffi.new("vllm_model_info *", {"struct_size": ffi.sizeof("vllm_model_info")})
        api.ok(lib.vllm_engine_model_info(e, info))
        assert info.eos_token_id == -1
        assert list(info.eog_token_ids[0:info.n_eog_token_ids]) == [3, 9]
    finally:
        lib.vllm_engine_free(e)


@pytest.mark.parametrize("async_scheduling", [1, -1, 0])
def test_async_scheduling_gives_the_same_tokens(api, tmp_path, async_scheduling):
    path = write_config(tmp_path, "LlamaForCausalLM")
    want = _oracle_tokens(path, [4, 5, 6])
    e = api.create(path, load_format="dummy", skip_tokenizer_init=1, device="cpu",
                   async_scheduling=async_scheduling)
    try:
        assert _step_tokens(api, e, [4, 5, 6]) == want
    finally:
        api.lib.vllm_engine_free(e)


@pytest.mark.parametrize("fields, reason", [
    ({"load_format": "safetensors"}, "load_format must be auto or dummy"),
    ({"gpu_memory_utilization": 1.5}, "GPU memory utilization must be in (0, 1]"),
    ({"async_scheduling": 2}, "params->async_scheduling must be -1, 0 or 1, got 2"),
])
def test_bad_values_fail_create(api, tmp_path, fields, reason):
    p, _keep = api.params(**fields)
    out = api.ffi.new("vllm_engine **")
    path = write_config(tmp_path, "LlamaForCausalLM").encode()
    assert api.lib.vllm_engine_create(path, p, out) == api.lib.VLLM_ERR_INVALID_ARGUMENT
    assert reason in api.error()
