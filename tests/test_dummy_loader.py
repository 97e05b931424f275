"""load_format="dummy" and skip_tokenizer_init (vLLM EngineArgs): random weights with an
architecture's shapes from config.json alone, token-id prompts in, token ids out.

Upstream: vllm/model_executor/model_loader/dummy_loader.py, weight_utils.py
(initialize_dummy_weights), tests/model_executor/model_loader (dummy loading smoke).
"""

from __future__ import annotations

import json

import pytest
import torch

from libvllm.engine.config import EngineConfig
from libvllm.engine.errors import InvalidArgumentError, ModelLoadError
from libvllm.engine.llm_engine import LLMEngine
from libvllm.engine.model_loader.dummy_loader import DUMMY_HIGH, DUMMY_LOW
from libvllm.engine.resolved_config import DeviceFacts, resolve_config
from libvllm.engine.sampling_params import SamplingParams

_BASE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
         "max_position_embeddings": 256, "rms_norm_eps": 1e-6}
CONFIGS = {
    "LlamaForCausalLM": {"model_type": "llama", "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 128}},
    "Qwen3ForCausalLM": {"model_type": "qwen3", "head_dim": 32, "tie_word_embeddings": True},
    "Qwen3MoeForCausalLM": {"model_type": "qwen3_moe", "head_dim": 16, "num_experts": 8,
                            "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                            "norm_topk_prob": True},
}


def write_config(tmp_path, arch: str) -> str:
    d = tmp_path / arch
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": [arch], **_BASE,
                                               **CONFIGS[arch]}))
    return str(d)


def dummy_engine(path: str, **kw) -> LLMEngine:
    return LLMEngine.from_config(EngineConfig(path, device="cpu", load_format="dummy",
                                              skip_tokenizer_init=True, **kw))


@pytest.mark.parametrize("arch", list(CONFIGS))
def test_dummy_weights_have_the_architecture_shapes_and_vllm_range(tmp_path, arch):
    engine = dummy_engine(write_config(tmp_path, arch))
    model = engine.model_runner.model
    params = dict(model.named_parameters())
    assert params["model.embed_tokens.weight"].shape == (256, 64)
    for name, p in params.items():
        assert p.dtype == torch.float32 and p.device.type == "cpu", name
        assert DUMMY_LOW <= p.min().item() and p.max().item() <= DUMMY_HIGH, name
        assert p.abs().max().item() > 0, name  # filled, not left empty / zero
    if arch == "Qwen3MoeForCausalLM":
        assert params["model.layers.0.mlp.experts.w13_weight"].shape == (8, 64, 64)
    again = dummy_engine(str(tmp_path / arch)).model_runner.model  # seeded: same weights
    assert all(torch.equal(p, dict(again.named_parameters())[n]) for n, p in params.items())


def test_token_id_prompts_give_token_ids_and_empty_text(tmp_path):
    engine = dummy_engine(write_config(tmp_path, "LlamaForCausalLM"))
    assert engine.tokenizer is None and engine.model_info.eos_token_id == -1
    engine.add_request("a", [1, 2, 3, 4], SamplingParams(temperature=0.0, max_tokens=5))
    outs = []
    while engine.has_unfinished_requests():
        outs.extend(engine.step())
    final = [o for o in outs if o.finished][0].outputs[0]
    assert len(final.token_ids) == 5 and final.text == ""
    assert all(0 <= t < 256 for t in final.token_ids)


def test_text_prompt_without_tokenizer_is_rejected(tmp_path):
    engine = dummy_engine(write_config(tmp_path, "Qwen3ForCausalLM"))
    with pytest.raises(InvalidArgumentError, match="skip_tokenizer_init"):
        engine.add_request("a", "hello", SamplingParams(max_tokens=2))


def test_dummy_needs_a_config_directory(tmp_path):
    with pytest.raises(ModelLoadError, match="config.json"):
        dummy_engine(str(tmp_path))


@pytest.mark.parametrize("field,value", [("load_format", "pt"), ("gpu_memory_utilization", 0.0),
                                         ("gpu_memory_utilization", 1.5),
                                         ("cudagraph_capture_sizes", [0]),
                                         ("max_cudagraph_capture_size", 0)])
def test_config_rejects_bad_values(field, value):
    with pytest.raises(InvalidArgumentError, match=field.split("_")[0]
                       if field != "gpu_memory_utilization" else "GPU memory"):
        EngineConfig("m", **{field: value})


def _capture_sizes(**kwargs) -> list[int]:
    return resolve_config(EngineConfig("m", **kwargs), 4096,
                          DeviceFacts("cpu")).compilation.capture_sizes()


def test_cudagraph_capture_ladder_is_vllms():
    """In tokens, derived from max_num_seqs as vLLM's _set_cudagraph_sizes (more cases in
    tests/test_cudagraph_dispatch.py)."""
    sizes = _capture_sizes(max_num_seqs=256)
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[-3:] == [480, 496, 512]
    # ceiling 2 x 512 (vLLM: 512 on Hopper; engine/worker/cudagraph_dispatcher.py)
    assert _capture_sizes(max_num_seqs=512)[-2:] == [1008, 1024]
    assert 248 in sizes and 256 in sizes and 272 in sizes and 264 not in sizes
    assert _capture_sizes(max_num_seqs=8) == [1, 2, 4, 8, 16]
    assert _capture_sizes(cudagraph_capture_sizes=[4, 1, 4, 99999]) \
        == [1, 4]
    assert _capture_sizes(enforce_eager=True) == []
