"""vllm_embed (vllm.h 1.3) through build/libvllm.so loaded into this process, on an engine
created with runner "pooling" (convert "auto": embed) from the default SmolLM2 GGUF.

Oracle: transformers fp32 from the same GGUF with the converted decoder's pooling rule
(tests/pooling_reference.py), cosine >= 0.9999 per vector. Also the header's two-call
sizing (the sizing call runs nothing and reports n_inputs x dim), text and token-id inputs
giving the same vectors, both driving modes, vLLM's errors (dimensions on a model that is
not matryoshka; a generate engine: "Embedding API is not supported by this model"), and
the engine params' checks of runner / convert / pooler_config. Mirrors vLLM 0.33
tests/entrypoints/pooling/embed/test_offline.py (LLM.embed) and
tests/models/language/pooling/test_embedding.py (HF parity).
"""

from __future__ import annotations

import numpy as np
import pytest
from pooling_reference import MIN_COSINE, TEXTS, cosine, hf_embeddings
from test_capi_stream import open_library
from test_dummy_loader import write_config

pytestmark = [pytest.mark.capi]
api = pytest.fixture(scope="module")(open_library)


@pytest.fixture(scope="module")
def pooling(api, model_path):
    engine = api.create(model_path, runner="pooling", served_model_name="smol")
    yield engine
    api.lib.vllm_engine_free(engine)


def _embed(api, engine, texts=None, token_ids=None, dimensions=0, capacity=None):
    """(status, vectors or None, n_floats, dim) of one vllm_embed call."""
    ffi, lib = api.ffi, api.lib
    keep = []
    texts_c = lens_c = ids_c = n_ids_c = ffi.NULL
    n = len(texts if texts is not None else token_ids)
    if texts is not None:
        keep = [ffi.new("char[]", t.encode()) for t in texts]
        texts_c = ffi.new("const char *[]", keep)
        lens_c = ffi.new("size_t[]", [len(t.encode()) for t in texts])
    if token_ids is not None:
        keep = [ffi.new("int32_t[]", ids) for ids in token_ids]
        ids_c = ffi.new("const int32_t *[]", keep)
        n_ids_c = ffi.new("size_t[]", [len(ids) for ids in token_ids])
    n_floats, dim = ffi.new("size_t *"), ffi.new("size_t *")
    if capacity is None:  # the header's two-call sizing
        status = lib.vllm_embed(engine, texts_c, lens_c, ids_c, n_ids_c, n, dimensions,
                                ffi.NULL, 0, n_floats, dim)
        if status != lib.VLLM_ERR_BUFFER_TOO_SMALL:
            return status, None, n_floats[0], dim[0]
        capacity = n_floats[0]
    out = ffi.new("float[]", max(capacity, 1))
    status = lib.vllm_embed(engine, texts_c, lens_c, ids_c, n_ids_c, n, dimensions, out,
                            capacity, n_floats, dim)
    vectors = np.frombuffer(ffi.buffer(out, 4 * n_floats[0]), np.float32).reshape(
        n, dim[0]) if status == lib.VLLM_OK else None
    return status, vectors, n_floats[0], dim[0]


def test_vectors_match_transformers_fp32_in_both_driving_modes(api, pooling, hf_test_model,
                                                                hf_test_tokenizer):
    prompts = [hf_test_tokenizer(t).input_ids for t in TEXTS]
    want = hf_embeddings(hf_test_model, prompts)
    status, by_ids, n_floats, dim = _embed(api, pooling, token_ids=prompts)
    api.ok(status)
    assert (n_floats, dim) == (len(TEXTS) * 576, 576)
    for got, ref in zip(by_ids, want):
        assert cosine(got, ref) >= MIN_COSINE
        assert abs(np.linalg.norm(got) - 1) < 1e-5
    status, by_text, _, _ = _embed(api, pooling, texts=TEXTS)
    api.ok(status)
    assert np.allclose(by_text, by_ids, atol=1e-6)
    api.ok(api.lib.vllm_engine_start_loop(pooling))  # the background loop runs them too
    status, looped, _, _ = _embed(api, pooling, texts=TEXTS)
    api.ok(status)
    assert np.allclose(looped, by_ids, atol=1e-6)


def test_two_call_sizing_and_errors(api, pooling):
    lib = api.lib
    status, _, n_floats, dim = _embed(api, pooling, texts=["a", "b"], capacity=3)
    assert status == lib.VLLM_ERR_BUFFER_TOO_SMALL and (n_floats, dim) == (2 * 576, 576)
    status, *_ = _embed(api, pooling, texts=["a"], dimensions=8)
    assert status == lib.VLLM_ERR_INVALID_ARGUMENT
    assert api.error() == ("Model 'smol' does not support Matryoshka embeddings; dimensions "
                           "must be unset (received dimensions=8).")
    status, *_ = _embed(api, pooling, token_ids=[[10**7]])
    assert status == lib.VLLM_ERR_INVALID_ARGUMENT and "out of vocabulary" in api.error()
    status, *_ = _embed(api, pooling, texts=[""])
    assert status == lib.VLLM_ERR_INVALID_ARGUMENT and "cannot be empty" in api.error()
    ffi = api.ffi
    n_floats, dim = ffi.new("size_t *"), ffi.new("size_t *")
    api.ok(lib.vllm_embed(pooling, ffi.NULL, ffi.NULL, ffi.NULL, ffi.NULL, 1, 0, ffi.NULL, 0,
                          n_floats, dim), lib.VLLM_ERR_INVALID_ARGUMENT)
    assert "exactly one of texts and token_ids" in api.error()
    api.ok(lib.vllm_embed(ffi.NULL, ffi.NULL, ffi.NULL, ffi.NULL, ffi.NULL, 1, 0, ffi.NULL, 0,
                          n_floats, dim), lib.VLLM_ERR_INVALID_ARGUMENT)
    api.ok(lib.vllm_embed(pooling, ffi.NULL, ffi.NULL, ffi.NULL, ffi.NULL, 1, 0, ffi.NULL, 0,
                          ffi.NULL, dim), lib.VLLM_ERR_INVALID_ARGUMENT)


def test_generate_engine_refuses_vllm_embed_and_params_are_checked(api, tmp_path):
    lib, ffi = api.lib, api.ffi
    path = write_config(tmp_path, "LlamaForCausalLM")
    generate = api.create(path, load_format="dummy", skip_tokenizer_init=1, device="cpu")
    try:
        status, *_ = _embed(api, generate, token_ids=[[1, 2]])
        assert status == lib.VLLM_ERR_UNSUPPORTED
        assert api.error() == ("Embedding API is not supported by this model. Try converting "
                               "the model using `--convert embed`.")
    finally:
        lib.vllm_engine_free(generate)
    for fields, message in (({"runner": "embed"}, "runner must be one of"),
                            ({"runner": "pooling", "convert": "none"},
                             "does not support `--runner pooling`"),
                            ({"runner": "pooling", "pooler_config": "{\"normalize\": 1}"},
                             "`normalize` was removed")):
        p, _keep = api.params(load_format="dummy", skip_tokenizer_init=1, device="cpu",
                              **fields)
        out = ffi.new("vllm_engine **")
        api.ok(lib.vllm_engine_create(path.encode(), p, out), lib.VLLM_ERR_INVALID_ARGUMENT)
        assert message in api.error()
