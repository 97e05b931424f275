"""The typed sampling params of vllm.h 0.2 (penalties, min_tokens, stop strings, logit_bias,
allowed_token_ids, bad_words) reach the engine with vLLM's semantics and validation.

Driven through build/libvllm.so loaded into this process (the helpers of
tests/test_capi_stream.py). Oracles: the engine's own greedy text for the same prompt
through the same ABI (stop strings cut it, bad words remove a word), the tokenizer
through vllm_tokenize (forced tokens), vLLM's validation messages, and the struct_size
contract (a 0.1-sized struct gets the defaults of the new fields). Also the engine's
tokenizer override (vllm_engine_params.tokenizer, vLLM's --tokenizer).
"""

from __future__ import annotations

import json

import pytest

from libvllm.engine.gguf.reader import GGUFReader
from libvllm.engine.tokenizer import Tokenizer
from tests.test_capi_stream import PROMPT, open_library

pytestmark = [pytest.mark.capi, pytest.mark.slow]

api = pytest.fixture(scope="module")(open_library)


@pytest.fixture(scope="module")
def engine(api, model_path):
    e = api.create(model_path)
    yield e
    api.lib.vllm_engine_free(e)


def _params(api, keep, max_tokens=24, **fields):
    sp = api.greedy(max_tokens)
    for name, value in fields.items():
        if name in ("stop", "bad_words"):
            arr = api.ffi.new("const char *[]", [api.ffi.new("char[]", w.encode())
                                                 for w in value])
            keep.append([arr] + [arr[i] for i in range(len(value))])
            setattr(sp, name, arr)
            setattr(sp, "n_" + name, len(value))
        else:
            setattr(sp, name, value)
    return sp


def _token(api, engine, text: str) -> int:
    ids, n = api.ffi.new("int32_t[8]"), api.ffi.new("size_t *")
    data = text.encode()
    api.ok(api.lib.vllm_tokenize(engine, data, len(data), 0, 1, ids, 8, n))
    assert n[0] == 1, text
    return ids[0]


def test_stop_string_cuts_the_greedy_text(api, engine):
    full = api.step_text(engine, "full", api.greedy(24))
    assert "Paris" in full
    keep = []
    cut = api.step_text(engine, "stop", _params(api, keep, stop=["Paris"]))
    assert cut == full[:full.index("Paris")]
    kept = api.step_text(engine, "keep", _params(api, keep, stop=["Paris"],
                                                  include_stop_str_in_output=1))
    assert kept == full[:full.index("Paris") + len("Paris")]


def test_bad_words_are_never_generated(api, engine):
    keep = []
    text = api.step_text(engine, "bad", _params(api, keep, bad_words=["Paris", " Paris"]))
    assert "Paris" not in text


def test_allowed_tokens_and_logit_bias_force_tokens(api, engine):
    the = _token(api, engine, " the")
    allowed = api.ffi.new("int32_t[]", [the])
    sp = _params(api, [], max_tokens=4, allowed_token_ids=allowed, n_allowed_token_ids=1)
    assert api.step_text(engine, "allowed", sp) == " the" * 4
    ids, values = api.ffi.new("int32_t[]", [the]), api.ffi.new("float[]", [100.0])
    sp = _params(api, [], max_tokens=3, logit_bias_token_ids=ids, logit_bias_values=values,
                 n_logit_bias=1)
    assert api.step_text(engine, "bias", sp) == " the" * 3


def test_penalties_are_validated_with_vllms_messages(api, engine):
    lib, ffi = api.lib, api.ffi
    for fields, message in [
        ({"repetition_penalty": 0.0}, "repetition_penalty must be greater than zero"),
        ({"presence_penalty": 3.0}, "presence_penalty must be in [-2, 2], got 3.0."),
        ({"min_tokens": 30}, "min_tokens must be less than or equal to max_tokens=24"),
        ({"n_stop": 1}, "a params array pointer is NULL"),
    ]:
        sp = _params(api, [], **fields)
        st = lib.vllm_request_add(engine, b"bad", PROMPT.encode(), ffi.NULL, 0, sp)
        api.ok(st, lib.VLLM_ERR_INVALID_ARGUMENT)
        assert message in api.error()
    sp = _params(api, [], repetition_penalty=1.3)  # a valid penalty changes nothing else
    assert api.step_text(engine, "rep", sp)


def test_a_v0_1_sized_struct_gets_the_new_defaults(api, engine):
    sp = api.greedy(24)
    sp.struct_size = api.ffi.offsetof("vllm_sampling_params", "presence_penalty")
    sp.repetition_penalty = 0.0  # beyond the caller's struct: must not be read
    assert api.step_text(engine, "v01", sp) == api.step_text(engine, "v02", api.greedy(24))


def test_tokenizer_override_is_a_hf_directory(api, model_path, tmp_path):
    """vLLM's --tokenizer: an engine on the GGUF with the tokenizer read from a directory
    (here the GGUF's own tokenizer saved as tokenizer.json) tokenizes the same; a missing
    directory is a model-load error naming it."""
    with GGUFReader(model_path) as r:
        tok = Tokenizer.from_gguf_metadata(r.metadata)
    tok.backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": tok.bos_token, "eos_token": tok.eos_token}))
    lib, ffi = api.lib, api.ffi
    e = api.create(model_path, tokenizer=str(tmp_path))
    ids, n = ffi.new("int32_t[64]"), ffi.new("size_t *")
    data = "Hello wörld 123".encode()
    api.ok(lib.vllm_tokenize(e, data, len(data), 1, 1, ids, 64, n))
    assert list(ids[0:n[0]]) == tok.encode("Hello wörld 123")
    lib.vllm_engine_free(e)
    p, _keep = api.params(tokenizer=str(tmp_path / "missing"))
    out = ffi.new("vllm_engine **")
    api.ok(lib.vllm_engine_create(model_path.encode(), p, out), lib.VLLM_ERR_MODEL_LOAD)
    assert "missing" in api.error()


def test_repetition_fields_end_a_repeating_request(api, engine):
    """vllm.h 1.2: repetition_* (vLLM's repetition_detection). Every token is " the"
    (allowed_token_ids), so a pattern of size 1 repeated 3 times ends the request at its
    third token with VLLM_FINISH_REPETITION, counted in request_success_repetition;
    min_count 1 is refused with vLLM's message."""
    lib, ffi = api.lib, api.ffi
    allowed = ffi.new("int32_t[]", [_token(api, engine, " the")])
    metrics = ffi.new("vllm_metrics *")
    metrics.struct_size = ffi.sizeof("vllm_metrics")
    api.ok(lib.vllm_engine_metrics(engine, metrics))
    before = metrics.request_success_repetition
    sp = _params(api, [], max_tokens=10, allowed_token_ids=allowed, n_allowed_token_ids=1,
                 repetition_max_pattern_size=2, repetition_min_count=3)
    api.ok(lib.vllm_request_add(engine, b"rep", PROMPT.encode(), ffi.NULL, 0, sp))
    outs, n, tokens, reasons = ffi.new("vllm_request_output **"), ffi.new("size_t *"), 0, []
    while not reasons:
        api.ok(lib.vllm_engine_step(engine, outs, n))
        for i in range(n[0]):
            tokens += outs[0][i].n_token_ids
            reasons += [outs[0][i].finish_reason] if outs[0][i].finished else []
    assert (tokens, reasons) == (3, [lib.VLLM_FINISH_REPETITION])
    api.ok(lib.vllm_engine_metrics(engine, metrics))
    assert metrics.request_success_repetition == before + 1
    older = ffi.new("vllm_metrics *")  # a caller of a 1.1 header: its struct ends before
    older.struct_size = ffi.offsetof("vllm_metrics", "request_success_repetition")
    older.request_success_repetition = -7
    api.ok(lib.vllm_engine_metrics(engine, older))
    assert older.request_success_repetition == -7 and older.request_success_length >= 0
    sp = _params(api, [], repetition_max_pattern_size=2, repetition_min_count=1)
    api.ok(lib.vllm_request_add(engine, b"bad", PROMPT.encode(), ffi.NULL, 0, sp),
           lib.VLLM_ERR_INVALID_ARGUMENT)
    assert "min_count must be >= 2" in api.error()


def test_thinking_token_budget_through_the_abi(api, engine, model_path):
    """vllm.h 1.2: vllm_engine_params.reasoning_start_str / reasoning_end_str and
    vllm_sampling_params.thinking_token_budget (-1 by default: unlimited). The prompt ends
    in the start marker, so budget 0 forces the end marker's tokens first (its text);
    -2 is refused with vLLM's message, and a budget on an engine without markers too."""
    lib, ffi = api.lib, api.ffi
    prompt = b"The following numbers of the sequence 0, 1, 2, 3, 4, 5 are:"
    assert api.greedy(4).thinking_token_budget == -1
    sp = _params(api, [], max_tokens=4, thinking_token_budget=3)
    api.ok(lib.vllm_request_add(engine, b"nomarkers", prompt, ffi.NULL, 0, sp),
           lib.VLLM_ERR_INVALID_ARGUMENT)
    assert "reasoning_config is not configured" in api.error()
    thinking = api.create(model_path, reasoning_start_str=":",
                          reasoning_end_str=" So the answer is")
    try:
        sp = _params(api, [], max_tokens=5, thinking_token_budget=0)
        api.ok(lib.vllm_request_add(thinking, b"forced", prompt, ffi.NULL, 0, sp))
        outs, n, left, text = ffi.new("vllm_request_output **"), ffi.new("size_t *"), \
            ffi.new("size_t *", 1), ""
        while left[0]:
            api.ok(lib.vllm_engine_step(thinking, outs, n))
            text += "".join(ffi.string(outs[0][i].text).decode() for i in range(n[0]))
            api.ok(lib.vllm_engine_num_unfinished(thinking, left))
        assert text.startswith(" So the answer is"), text
        sp = _params(api, [], thinking_token_budget=-2)
        api.ok(lib.vllm_request_add(thinking, b"bad", prompt, ffi.NULL, 0, sp),
               lib.VLLM_ERR_INVALID_ARGUMENT)
        assert "must be a non-negative integer or -1 for unlimited" in api.error()
    finally:
        lib.vllm_engine_free(thinking)
