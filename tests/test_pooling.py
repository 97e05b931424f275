"""The pooling runner's configuration, parameters and pooling math, and a pooling engine on a
tiny dummy Llama (random seeded weights, no files).

Ports vLLM 0.33 tests/test_pooling_params.py (test_embed: use_activation None / True / False
all verify; test_embed_dimensions: dimensions refused on a model that is not matryoshka;
test_removed_pooling_parameters: `normalize`), tests/models/language/pooling/
test_pooler_config_init_behaviour.py (the converted decoder's defaults: LAST, activation
on) and test_all_pooling_plus_chunked_prefill.py (the pooled outputs of a prompt run in
chunks equal those of one pass). Oracles: the engine's own token_embed rows (task ALL,
use_activation off: the raw hidden states of every prompt position), of which LAST / CLS /
MEAN must be the last row, the first row and the mean, then normalized; torch's
F.normalize for the truncate-then-renormalize rule of vllm/model_executor/layers/pooler.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from test_dummy_loader import write_config

from libvllm.engine.config import EngineConfig
from libvllm.engine.errors import InvalidArgumentError, UnsupportedError
from libvllm.engine.layers.pooler import embed_activation, pool_hidden_states
from libvllm.engine.llm_engine import EMBED_ON_GENERATE, GENERATE_ON_POOLING, LLMEngine
from libvllm.engine.pooler_config import PoolerConfig, resolve_pooler_config, resolve_runner_type
from libvllm.engine.pooling_params import PoolingParams
from libvllm.engine.sampling_params import SamplingParams

PROMPTS = [list(range(3, 40)), list(range(50, 55)), [7]]  # 37, 5 and 1 tokens


def test_runner_and_convert_resolve_as_vllm():
    assert resolve_runner_type("auto", "auto") == "generate"
    assert resolve_runner_type("pooling", "auto") == "pooling"  # convert auto -> embed
    assert resolve_runner_type("auto", "embed") == "pooling"  # vLLM's _get_runner_type
    with pytest.raises(InvalidArgumentError, match="does not support `--runner pooling`"):
        resolve_runner_type("pooling", "none")
    with pytest.raises(InvalidArgumentError, match="does not support `--runner generate`"):
        resolve_runner_type("generate", "embed")
    with pytest.raises(UnsupportedError, match="classify"):
        resolve_runner_type("pooling", "classify")
    for bad in ({"runner": "draft"}, {"convert": "reward"}):
        with pytest.raises(InvalidArgumentError):
            EngineConfig("m", **bad)


def test_pooler_config_names_checks_and_converted_defaults():
    assert PoolerConfig(pooling_type="MEAN").seq_pooling_type == "MEAN"
    assert PoolerConfig(pooling_type="ALL").tok_pooling_type == "ALL"
    with pytest.raises(InvalidArgumentError, match="Cannot set both"):
        PoolerConfig(pooling_type="MEAN", seq_pooling_type="CLS")
    with pytest.raises(InvalidArgumentError, match="`normalize` was removed"):
        PoolerConfig.from_json('{"normalize": true}')
    with pytest.raises(InvalidArgumentError, match="not valid JSON"):
        PoolerConfig.from_json("{")
    with pytest.raises(InvalidArgumentError, match="unknown pooler_config"):
        PoolerConfig.from_json('{"pooling": 1}')
    with pytest.raises(InvalidArgumentError, match="pooling_type"):
        PoolerConfig(pooling_type="STEP")
    resolved = resolve_pooler_config(None)  # as_embedding_model's default pooler
    assert (resolved.seq_pooling_type, resolved.tok_pooling_type) == ("LAST", "ALL")
    config = EngineConfig("m", runner="pooling", pooler_config='{"pooling_type": "CLS"}')
    assert config.resolved_pooler().seq_pooling_type == "CLS"
    wire = json.loads(json.dumps(dataclasses.asdict(config)))  # as the core process gets it
    assert EngineConfig(**wire).resolved_pooler().seq_pooling_type == "CLS"


def test_pooling_params_verify_as_vllm():
    pooler = resolve_pooler_config(None)
    for use_activation in (None, True, False):
        done = PoolingParams(use_activation=use_activation).verify(pooler, "m", 32)
        assert done.use_activation is (True if use_activation is None else use_activation)
        assert done.task == "embed"
    with pytest.raises(InvalidArgumentError, match="Model 'm' does not support Matryoshka "
                       r"embeddings; dimensions must be unset \(received dimensions=1\)"):
        PoolingParams(dimensions=1).verify(pooler, "m", 32)
    with pytest.raises(InvalidArgumentError, match=r"range \[1, 32\], got 33"):
        PoolingParams(dimensions=33).verify(pooler, "m", 32, is_matryoshka=True)
    with pytest.raises(InvalidArgumentError, match=r"Matryoshka dimensions \[8, 16\], got 9"):
        PoolingParams(dimensions=9).verify(pooler, "m", 32, [8, 16], is_matryoshka=True)
    assert PoolingParams(dimensions=8).verify(pooler, "m", 32, [8], True).dimensions == 8
    with pytest.raises(InvalidArgumentError, match="Unsupported task"):
        PoolingParams(task="classify").verify(pooler, "m", 32)


def test_pooling_methods_and_truncate_then_renormalize():
    hidden = torch.randn(5, 8)
    assert torch.equal(pool_hidden_states(hidden, "LAST"), hidden[-1])
    assert torch.equal(pool_hidden_states(hidden, "CLS"), hidden[0])
    assert torch.allclose(pool_hidden_states(hidden, "MEAN"), hidden.mean(0))
    assert torch.equal(pool_hidden_states(hidden, "ALL"), hidden)
    out = embed_activation(hidden[-1], 3, True)
    assert out.shape == (3,) and torch.allclose(out, hidden[-1, :3] / hidden[-1, :3].norm())
    assert torch.equal(embed_activation(hidden[-1], None, False), hidden[-1])


def _pool(engine: LLMEngine, prompts, params: PoolingParams) -> list[torch.Tensor]:
    for i, p in enumerate(prompts):
        engine.add_pooling_request(f"p{i}", p, params)
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            done[out.request_id] = out
    assert all(out.finished and out.outputs is not None for out in done.values())
    assert [done[f"p{i}"].prompt_token_ids for i in range(len(prompts))] == prompts
    return [torch.tensor(done[f"p{i}"].outputs.data) for i in range(len(prompts))]


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> str:
    return write_config(tmp_path_factory.mktemp("pool"), "LlamaForCausalLM")


def _engine(path: str, pooling_type: str, **kw) -> LLMEngine:
    return LLMEngine.from_config(EngineConfig(
        path, device="cpu", load_format="dummy", skip_tokenizer_init=True, runner="pooling",
        max_model_len=128, pooler_config={"pooling_type": pooling_type}, **kw))


@pytest.mark.parametrize("pooling_type", ["LAST", "CLS", "MEAN"])
def test_seq_pooling_is_the_rule_over_the_prompt_hidden_states(llama_dir, pooling_type):
    engine = _engine(llama_dir, pooling_type)
    rows = _pool(engine, PROMPTS, PoolingParams(use_activation=False, task="token_embed"))
    assert [r.shape[0] for r in rows] == [len(p) for p in PROMPTS]
    pooled = _pool(engine, PROMPTS, PoolingParams())
    raw = _pool(engine, PROMPTS, PoolingParams(use_activation=False))
    for r, vec, unnormed in zip(rows, pooled, raw):
        want = {"LAST": r[-1], "CLS": r[0], "MEAN": r.mean(0)}[pooling_type]
        assert torch.allclose(unnormed, want, atol=1e-5)
        assert torch.allclose(vec, torch.nn.functional.normalize(want, dim=0), atol=1e-5)
    assert engine.scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == \
        engine.scheduler.kv_cache_manager.block_pool.num_gpu_blocks - 1  # no KV kept


@pytest.mark.parametrize("pooling_type", ["LAST", "CLS", "MEAN"])
def test_chunked_prefill_pools_the_same_vectors(llama_dir, pooling_type):
    whole = _pool(_engine(llama_dir, pooling_type), PROMPTS, PoolingParams())
    chunked_engine = _engine(llama_dir, pooling_type, max_num_batched_tokens=8,
                             max_num_seqs=4)
    chunked = _pool(chunked_engine, PROMPTS, PoolingParams())
    for a, b in zip(whole, chunked):
        assert torch.allclose(a, b, atol=1e-5)
    rows = _pool(chunked_engine, PROMPTS, PoolingParams(task="token_embed"))
    assert [r.shape[0] for r in rows] == [len(p) for p in PROMPTS]


def test_each_runner_refuses_the_other_kind_of_request(llama_dir):
    pooling = _engine(llama_dir, "LAST")
    with pytest.raises(UnsupportedError, match="only supported for generative models"):
        pooling.add_request("g", [1, 2], SamplingParams(max_tokens=2))
    assert GENERATE_ON_POOLING.startswith("LLM.generate()")
    generate = LLMEngine.from_config(EngineConfig(
        llama_dir, device="cpu", load_format="dummy", skip_tokenizer_init=True))
    with pytest.raises(UnsupportedError) as e:
        generate.add_pooling_request("e", [1, 2], PoolingParams())
    assert str(e.value) == EMBED_ON_GENERATE
    with pytest.raises(InvalidArgumentError, match="out of vocabulary"):
        pooling.add_pooling_request("bad", [10**6], PoolingParams())
    with pytest.raises(InvalidArgumentError, match="cannot be empty"):
        pooling.add_pooling_request("empty", [], PoolingParams())


def test_abort_ends_a_pooling_request_without_output(llama_dir):
    engine = _engine(llama_dir, "LAST")
    engine.add_pooling_request("a", PROMPTS[0], PoolingParams())
    engine.abort_request("a")
    outs = engine.step()
    assert [(o.request_id, o.outputs, o.finished) for o in outs] == [("a", None, True)]
    assert not engine.has_unfinished_requests()
    assert _pool(engine, PROMPTS[:1], PoolingParams())[0].shape == (64,)


def test_core_in_a_child_process_pools_the_same(llama_dir):
    """The pooling request and its output cross the core's socket (msgspec) unchanged."""
    prompts, params = PROMPTS[:2], PoolingParams(task="token_embed")
    inproc = _pool(_engine(llama_dir, "MEAN"), prompts, params)
    child = _engine(llama_dir, "MEAN", multiprocessing=True)
    try:
        assert all(torch.equal(a, b) for a, b in zip(inproc, _pool(child, prompts, params)))
        mean = _pool(child, prompts, PoolingParams())
        assert torch.allclose(mean[0], _pool(_engine(llama_dir, "MEAN"), prompts,
                                             PoolingParams())[0])
    finally:
        child.shutdown()


def test_each_runner_serves_only_its_routes():
    """vLLM registers the routers of the engine's tasks only: elsewhere 404."""
    from types import SimpleNamespace

    from libvllm.engine.entrypoints.pooling_routes import POOLING_ROUTES, pooling_request

    def client(runner_type):
        return SimpleNamespace(engine=SimpleNamespace(runner_type=runner_type))

    for path in POOLING_ROUTES:
        status, body, stream = pooling_request(client("generate"), "POST", path, "{}", "m")
        assert (status, json.loads(body)["error"]["code"], stream) == (404, 404, None)
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages"):
        assert pooling_request(client("pooling"), "POST", path, "{}", "m")[0] == 404
        assert pooling_request(client("generate"), "POST", path, "{}", "m") is None
    assert pooling_request(client("pooling"), "GET", "/v1/embeddings", "", "m")[0] == 405
    assert pooling_request(client("pooling"), "GET", "/v1/models", "", "m") is None


def test_openai_layer_of_each_runner(llama_dir):
    """handle_openai_request (vllm_openai_request's Python side) over an AsyncLLM."""
    from libvllm.engine.async_llm import AsyncLLM
    from libvllm.engine.entrypoints.openai.api import handle_openai_request

    body = json.dumps({"input": [PROMPTS[1], PROMPTS[2]], "encoding_format": "float"})
    generate = AsyncLLM(LLMEngine.from_config(EngineConfig(
        llama_dir, device="cpu", load_format="dummy", skip_tokenizer_init=True)))
    engine = _engine(llama_dir, "LAST")
    want = _pool(engine, [PROMPTS[1], PROMPTS[2]], PoolingParams())  # before its loop runs
    pooling = AsyncLLM(engine)
    try:
        result = handle_openai_request(generate, "POST", "/v1/embeddings", body,
                                       served_model_name="m")
        assert result.status == 404 and json.loads(result.body)["error"]["code"] == 404
        result = handle_openai_request(pooling, "POST", "/v1/embeddings", body,
                                       served_model_name="m")
        assert result.status == 200, result.body
        data = json.loads(result.body)["data"]
        assert [d["index"] for d in data] == [0, 1]
        assert all(torch.allclose(torch.tensor(d["embedding"]), w, atol=1e-6)
                   for d, w in zip(data, want))
        result = handle_openai_request(pooling, "POST", "/v1/completions",
                                       json.dumps({"prompt": [1, 2]}), served_model_name="m")
        assert result.status == 404
    finally:
        generate.shutdown()
        pooling.shutdown()


def test_dimensions_on_a_matryoshka_model(tmp_path, llama_dir):
    """vLLM's is_matryoshka / matryoshka_dimensions from the hf config: `dimensions` keeps
    the first d features of the pooled vector, normalized again; a size outside
    matryoshka_dimensions, or any size on a model without them, is vLLM's error
    (vllm/pooling_params.py verify; tests/entrypoints/pooling/embed/test_online_dimensions.py)."""
    config = json.loads(open(f"{llama_dir}/config.json").read())
    path = tmp_path / "matryoshka"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({**config, "matryoshka_dimensions": [16, 32]}))
    engine = _engine(str(path), "LAST")
    full = _pool(engine, [[1, 2, 3, 4]], PoolingParams())[0]
    cut = _pool(engine, [[1, 2, 3, 4]], PoolingParams(dimensions=16))[0]
    assert full.shape == (64,) and cut.shape == (16,)
    assert torch.allclose(cut, torch.nn.functional.normalize(full[:16], dim=0), atol=1e-6)
    with pytest.raises(InvalidArgumentError, match=r"only supports Matryoshka dimensions"):
        engine.add_pooling_request("bad", [1, 2], PoolingParams(dimensions=24))
    plain = _engine(llama_dir, "LAST")
    with pytest.raises(InvalidArgumentError, match="does not support Matryoshka embeddings"):
        plain.add_pooling_request("bad", [1, 2], PoolingParams(dimensions=16))
