"""A safetensors twin of the default model gives the same greedy tokens as its GGUF.

The twin is written here from the GGUF itself (plus a generation_config.json whose defaults
requests without their own values must get, as in vLLM): the dequantized weights under Hugging
Face names (Q/K un-permuted, what transformers' GGUF loader produces), a config.json with
the GGUF's hyper-parameters, and tokenizer.json / tokenizer_config.json from the GGUF's
tokenizer. Loading it goes through the safetensors loader and the HF-directory tokenizer;
the oracle is our engine on the GGUF (itself checked against transformers in
tests/test_generate_parity.py).
"""

from __future__ import annotations

import json

import pytest
from safetensors.torch import save_file

from libvllm.engine.async_llm import AsyncLLM
from libvllm.engine.config import EngineConfig
from libvllm.engine.entrypoints.openai.api import handle_openai_request
from libvllm.engine.gguf.reader import GGUFReader
from libvllm.engine.llm_engine import LLMEngine
from libvllm.engine.model_loader.gguf_loader import arch_config_from_gguf, gguf_weights_iterator
from libvllm.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, 日本"]


def _write_twin(model_path: str, out) -> None:
    with GGUFReader(model_path) as reader:
        cfg = arch_config_from_gguf(reader)
        weights = {name: w.contiguous() for name, w in gguf_weights_iterator(reader, cfg)}
    save_file(weights, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim,
        "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope_theta,
        "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": cfg.tie_word_embeddings, "torch_dtype": "float32",
    }))
    # defaults a request without its own values gets, as vLLM applies them
    (out / "generation_config.json").write_text(json.dumps(
        {"temperature": 0.0, "max_new_tokens": 5, "eos_token_id": 2}))


@pytest.fixture(scope="module")
def engines(model_path, tmp_path_factory):
    twin = tmp_path_factory.mktemp("smollm2-safetensors")
    _write_twin(model_path, twin)
    gguf = LLMEngine.from_config(EngineConfig(model=model_path, max_model_len=256))
    tok = gguf.tokenizer
    tok.backend.save(str(twin / "tokenizer.json"))
    (twin / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": tok.bos_token, "eos_token": tok.eos_token,
        "chat_template": tok.chat_template}))
    st = LLMEngine.from_config(EngineConfig(model=str(twin), max_model_len=256))
    return gguf, st


def _greedy(engine: LLMEngine) -> list[list[int]]:
    for i, p in enumerate(PROMPTS):
        engine.add_request(f"t{i}", p, SamplingParams(temperature=0.0, max_tokens=24))
    out = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                out[o.request_id] = o.outputs[0].token_ids
    return [out[f"t{i}"] for i in range(len(PROMPTS))]


def test_twin_tokenizes_like_the_gguf(engines):
    gguf, st = engines
    for p in PROMPTS:
        assert st.tokenizer.encode(p) == gguf.tokenizer.encode(p)
    assert st.model_info.eos_token_id == gguf.model_info.eos_token_id


def test_twin_gives_the_same_greedy_tokens(engines):
    gguf, st = engines
    assert _greedy(st) == _greedy(gguf)


def test_generation_config_defaults_apply_to_requests_without_values(engines):
    gguf, st = engines
    assert gguf.default_sampling_params == {}
    assert st.default_sampling_params == {"temperature": 0.0, "max_tokens": 5}
    sp = st.get_default_sampling_params()
    assert sp.temperature == 0.0 and sp.max_tokens == 5
    client = AsyncLLM(st)  # the OpenAI layer, last: the loop thread now owns the engine
    try:
        def chat(**extra):
            body = {"messages": [{"role": "user", "content": "Hi"}], **extra}
            res = handle_openai_request(client, "POST", "/v1/chat/completions",
                                        json.dumps(body), served_model_name="twin")
            assert res.status == 200, res.body
            return json.loads(res.body)
        implicit = chat()
        explicit = chat(temperature=0.0, max_tokens=5)
        assert implicit["usage"]["completion_tokens"] == 5
        assert implicit["choices"][0]["message"]["content"] == \
            explicit["choices"][0]["message"]["content"]
        assert chat(max_tokens=7)["usage"]["completion_tokens"] == 7  # the request wins
    finally:
        client.shutdown()
