"""examples/server with `--runner pooling --convert embed` on the default SmolLM2 GGUF: the
official openai SDK's embeddings.create (its default base64 encoding, and float), /pooling,
/score, /rerank against vLLM's response shapes, the generation routes' 404, and a small
fuzz of the new routes (never a 5xx, always vLLM's error shape, no traceback).

Oracle: transformers fp32 from the same GGUF with the converted decoder's pooling rule
(tests/pooling_reference.py), cosine >= 0.9999; /score and /rerank must be the cosine
similarity of the pair's /v1/embeddings vectors (vllm/entrypoints/pooling/scoring/
io_processor.py for an embedding model). Ports vLLM 0.33
tests/entrypoints/pooling/embed/test_online.py (test_completion_request(_batched),
test_base64_embedding, test_negative_token_ids, test_truncate_prompt_tokens,
test_use_activation, test_pooling_embed, test_pooling_not_supported),
embed/test_online_dimensions.py (dimensions on a model that is not matryoshka) and
scoring/test_bi_encoder_online.py (1:1, 1:N, N:N, the four spellings, rerank top_n,
the prompt length limit).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hostile_server import JSON, error_of, launch, no_traceback, request, stop_server
from pooling_reference import MIN_COSINE, TEXTS, cosine, hf_embeddings

openai = pytest.importorskip("openai")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

pytestmark = [pytest.mark.capi, pytest.mark.slow]
MODEL = "smol-embed"
DIM = 576  # SmolLM2-135M's hidden size


@pytest.fixture(scope="module")
def server(built, model_path, child_env, tmp_path_factory):
    log_path = tmp_path_factory.mktemp("pool") / "server.log"
    # /v1/models: 503 while the model loads
    proc, port = launch(built, model_path, child_env, log_path, (
        "--served-model-name", MODEL, "--max-model-len", "128", "--runner", "pooling",
        "--convert", "embed"), ready_path="/v1/models")
    yield port, log_path
    stop_server(proc)
    no_traceback(log_path)


def _post(port, path, body) -> tuple[int, dict]:
    status, _, text = request(port, "POST", path, json.dumps(body), JSON)
    return status, json.loads(text)


def _client(port):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")


def test_sdk_embeddings_match_transformers(server, hf_test_model, hf_test_tokenizer):
    port, _ = server
    client = _client(port)
    prompts = [hf_test_tokenizer(t).input_ids for t in TEXTS]
    want = hf_embeddings(hf_test_model, prompts)
    default = client.embeddings.create(model=MODEL, input=TEXTS)  # the SDK asks base64
    floats = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    by_ids = client.embeddings.create(model=MODEL, input=prompts, encoding_format="float")
    for response in (default, floats, by_ids):
        assert response.model == MODEL and response.object == "list"
        assert [d.index for d in response.data] == [0, 1, 2]
        assert response.usage.prompt_tokens == response.usage.total_tokens == \
            sum(len(p) for p in prompts)
        for d, ref in zip(response.data, want):
            assert len(d.embedding) == DIM
            assert abs(np.linalg.norm(d.embedding) - 1) < 1e-5
            assert cosine(d.embedding, ref) >= MIN_COSINE
    single = client.embeddings.create(model=MODEL, input=prompts[0], encoding_format="float")
    assert np.allclose(single.data[0].embedding, floats.data[0].embedding, atol=1e-6)
    status, raw = _post(port, "/v1/embeddings", {"input": TEXTS[0], "encoding_format": "base64"})
    assert status == 200 and raw["id"].startswith("embd-") and isinstance(
        raw["data"][0]["embedding"], str)


def test_embedding_errors_as_vllm(server):
    port, _ = server
    client = _client(port)
    with pytest.raises(openai.BadRequestError, match="does not support Matryoshka embeddings"):
        client.embeddings.create(model=MODEL, input="hi", dimensions=8)
    with pytest.raises(openai.BadRequestError, match="out of vocabulary"):
        client.embeddings.create(model=MODEL, input=[-1])
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="other", input="hi")
    status, body = _post(port, "/v1/embeddings", {"input": "hi", "normalize": True})
    assert "`normalize` was removed" in error_of(status, json.dumps(body), 400)["message"]
    status, body = _post(port, "/v1/embeddings", {"input": "word " * 200})
    assert status == 400 and "maximum context length" in body["error"]["message"]
    status, body = _post(port, "/v1/embeddings", {"input": "word " * 200,
                                                  "truncate_prompt_tokens": 10})
    assert status == 200 and body["usage"]["prompt_tokens"] == 10


def test_use_activation_and_pooling_route(server):
    port, _ = server
    outs = {}
    for flag in (None, True, False):
        status, body = _post(port, "/v1/embeddings", {"input": TEXTS[0], "use_activation": flag,
                                                      "encoding_format": "float"})
        assert status == 200
        outs[flag] = np.array(body["data"][0]["embedding"])
    assert np.allclose(outs[None], outs[True])
    assert np.allclose(outs[True], outs[False] / np.linalg.norm(outs[False]), atol=1e-5)
    status, body = _post(port, "/pooling", {"input": TEXTS[0], "encoding_format": "float"})
    assert status == 200 and body["id"].startswith("pool-") and body["object"] == "list"
    assert body["data"][0]["object"] == "pooling"
    assert np.allclose(body["data"][0]["data"], outs[True], atol=1e-6)
    for task, message in (("token_embed", "Try switching the model's pooling_task via"),
                          ("classify", "Unsupported task: 'classify'")):
        status, body = _post(port, "/pooling", {"input": "test", "task": task})
        assert message in error_of(status, json.dumps(body), 400)["message"]


def test_score_and_rerank_are_cosine_of_the_embeddings(server):
    port, _ = server
    query, docs = "What is the capital of France?", [
        "The capital of Brazil is Brasilia.", "The capital of France is Paris.", "cats"]
    status, emb = _post(port, "/v1/embeddings", {"input": [query, *docs],
                                                  "encoding_format": "float"})
    vectors = [np.array(d["embedding"]) for d in emb["data"]]
    want = [cosine(vectors[0], v) for v in vectors[1:]]
    for body in ({"queries": query, "documents": docs}, {"queries": query, "items": docs},
                 {"data_1": query, "data_2": docs}, {"text_1": query, "text_2": docs}):
        status, score = _post(port, "/score", body)
        assert status == 200 and score["object"] == "list" and score["model"] == MODEL
        assert [d["index"] for d in score["data"]] == [0, 1, 2]
        assert all(d["object"] == "score" for d in score["data"])
        assert np.allclose([d["score"] for d in score["data"]], want, atol=1e-5)
        assert score["usage"]["prompt_tokens"] == emb["usage"]["prompt_tokens"]
    status, pairs = _post(port, "/v1/score", {"queries": [query, docs[0]],
                                              "documents": [docs[1], docs[0]]})  # N:N
    assert np.allclose([d["score"] for d in pairs["data"]],
                       [want[1], 1.0], atol=1e-5)
    status, body = _post(port, "/score", {"queries": [query, query], "documents": docs})
    assert "1:1, 1:N or N:N" in error_of(status, json.dumps(body), 400)["message"]
    order = sorted(range(3), key=lambda i: -want[i])
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        status, rerank = _post(port, path, {"query": query, "documents": docs, "top_n": 2})
        assert status == 200 and rerank["model"] == MODEL and rerank["id"].startswith("rerank-")
        assert [r["index"] for r in rerank["results"]] == order[:2]
        assert [r["document"]["text"] for r in rerank["results"]] == [docs[i] for i in order[:2]]
        assert np.allclose([r["relevance_score"] for r in rerank["results"]],
                           [want[i] for i in order[:2]], atol=1e-5)
        assert set(rerank["usage"]) == {"prompt_tokens", "total_tokens"}
    status, rerank = _post(port, "/rerank", {"query": query * 30, "documents": docs})
    assert status == 400


def test_generation_routes_are_not_served(server):
    port, _ = server
    for path, body in (("/v1/completions", {"prompt": "hi"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                       ("/v1/responses", {"input": "hi"})):
        status, answer = _post(port, path, body)
        error_of(status, json.dumps(answer), 404)


_junk = st.recursive(st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats()
                     | st.text(max_size=8), lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)
_input = st.one_of(st.text(max_size=20), st.lists(st.integers(-5, 60000), max_size=4),
                   st.lists(st.text(max_size=10), max_size=3), _junk)
_common = {"model": st.one_of(st.just(MODEL), _junk), "use_activation": _junk,
           "truncate_prompt_tokens": st.one_of(st.integers(-3, 200), _junk),
           "encoding_format": st.one_of(st.sampled_from(["float", "base64", "bytes"]), _junk)}
_bodies = st.one_of(
    st.tuples(st.just("/v1/embeddings"), st.fixed_dictionaries(
        {"input": _input}, optional={**_common, "dimensions": st.one_of(st.integers(), _junk)})),
    st.tuples(st.just("/pooling"), st.fixed_dictionaries(
        {"input": _input}, optional={**_common, "task": _junk})),
    st.tuples(st.just("/score"), st.fixed_dictionaries({}, optional={
        "queries": _input, "documents": _input, "text_1": _input, "text_2": _input})),
    st.tuples(st.just("/rerank"), st.fixed_dictionaries({}, optional={
        "query": _input, "documents": _input, "top_n": st.one_of(st.integers(-2, 5), _junk)})),
    st.tuples(st.sampled_from(["/v1/embeddings", "/score"]), _junk))


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=_bodies)
def test_fuzz_new_routes_answer_4xx_or_200(server, case):
    port, _ = server
    path, body = case
    status, _, text = request(port, "POST", path, json.dumps(body), JSON)
    assert status in (200, 400, 404, 422) or (status == 413), (status, text)
    if status != 200:
        error_of(status, text, status)
