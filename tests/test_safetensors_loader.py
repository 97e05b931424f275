"""Hugging Face directory loading: config.json, safetensors (single / sharded), dtypes, tied
embeddings, generation_config.json, and hostile directories.

Oracles: transformers writes the directories (save_pretrained, single and sharded) and its
state dict is the expected content; vLLM's get_diff_sampling_param semantics for the
generation config; otherwise the error class and the name it must carry.
Mirrors vLLM 0.33 tests/model_executor/model_loader/test_filter_duplicate_safetensors.py
(index naming a missing file), tests/test_config.py::test_generation_config_loading and
tests/config/test_config_generation.py::test_get_diff_sampling_param_includes_penalties.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from libvllm.engine.errors import ModelLoadError, UnsupportedError
from libvllm.engine.model_loader import load_model
from libvllm.engine.models.config import get_diff_sampling_param

transformers = pytest.importorskip("transformers")

TINY = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)


def _hf(tie: bool = False, dtype: torch.dtype = torch.float32):
    cfg = transformers.LlamaConfig(**TINY, tie_word_embeddings=tie)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg).to(dtype).eval()


@pytest.fixture(scope="module")
def hf_model():
    return _hf()


@pytest.fixture(scope="module")
def single_dir(hf_model, tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("single")
    hf_model.save_pretrained(d)
    return d


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit_config(d: Path, **changes) -> None:
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(changes)
    (d / "config.json").write_text(json.dumps(cfg))


def _our_state(model) -> dict[str, torch.Tensor]:
    """Our parameters split back into HF names (qkv / gate_up unstacked)."""
    out = {}
    for name, p in model.named_parameters():
        if name.endswith("qkv_proj.weight"):
            q, k, v = p.split([TINY["hidden_size"], 16, 16])
            out |= {name.replace("qkv_proj", s): t for s, t in
                    zip(("q_proj", "k_proj", "v_proj"), (q, k, v))}
        elif name.endswith("gate_up_proj.weight"):
            g, u = p.chunk(2)
            out |= {name.replace("gate_up_proj", "gate_proj"): g,
                    name.replace("gate_up_proj", "up_proj"): u}
        else:
            out[name] = p
    return out


def _assert_same_weights(model, hf) -> None:
    ref = {k: v.float() for k, v in hf.state_dict().items()}
    got = _our_state(model)
    if hf.config.tie_word_embeddings:
        ref.pop("lm_head.weight")
    assert set(got) == set(ref)
    for k, v in ref.items():
        assert torch.equal(got[k], v), k


def test_single_file_loads_exact_weights(single_dir, hf_model):
    model, cfg, source = load_model(str(single_dir))
    assert source == str(single_dir) and cfg.architectures == ("LlamaForCausalLM",)
    _assert_same_weights(model, hf_model)


def test_sharded_checkpoint_equals_single(hf_model, tmp_path):
    hf_model.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("*.safetensors"))) > 2
    model, _, _ = load_model(str(tmp_path))
    _assert_same_weights(model, hf_model)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_checkpoints_upcast_exactly(dtype, tmp_path):
    hf = _hf(dtype=dtype)
    hf.save_pretrained(tmp_path)
    model, _, _ = load_model(str(tmp_path))
    assert all(p.dtype == torch.float32 for p in model.parameters())
    _assert_same_weights(model, hf)


def test_tied_embeddings(tmp_path):
    hf = _hf(tie=True)
    hf.save_pretrained(tmp_path)
    assert "lm_head.weight" not in load_file(tmp_path / "model.safetensors")
    model, cfg, _ = load_model(str(tmp_path))
    assert cfg.tie_word_embeddings and model.lm_head is model.model.embed_tokens
    _assert_same_weights(model, hf)


def test_generation_config_is_read(single_dir, tmp_path):
    d = _copy(single_dir, tmp_path / "m")
    (d / "generation_config.json").write_text(json.dumps({
        "bos_token_id": 1, "eos_token_id": [2, 7], "do_sample": True, "repetition_penalty": 1.1,
        "temperature": 0.7, "top_p": 0.8, "top_k": 20, "max_new_tokens": 64,
        "presence_penalty": 1.5}))
    _, cfg, _ = load_model(str(d))
    assert cfg.generation_config["eos_token_id"] == [2, 7]
    assert get_diff_sampling_param(cfg.generation_config) == {
        "repetition_penalty": 1.1, "temperature": 0.7, "top_p": 0.8, "top_k": 20,
        "max_tokens": 64, "presence_penalty": 1.5}


def test_diff_sampling_param_without_sampling_fields_is_empty():
    assert get_diff_sampling_param({"bos_token_id": 1, "eos_token_id": 2}) == {}
    assert get_diff_sampling_param({"temperature": None, "frequency_penalty": 0.5}) == {
        "frequency_penalty": 0.5}


def test_bad_generation_config_is_a_load_error(single_dir, tmp_path):
    d = _copy(single_dir, tmp_path / "m")
    (d / "generation_config.json").write_text(json.dumps({"temperature": "hot"}))
    with pytest.raises(ModelLoadError, match="temperature"):
        load_model(str(d))


def test_unknown_architecture_is_unsupported_and_named(single_dir, tmp_path):
    d = _copy(single_dir, tmp_path / "m")
    _edit_config(d, architectures=["FancyNewForCausalLM"])
    with pytest.raises(UnsupportedError, match="FancyNewForCausalLM.*LlamaForCausalLM"):
        load_model(str(d))


def test_code_in_the_directory_is_never_imported(single_dir, tmp_path):
    d = _copy(single_dir, tmp_path / "m")
    marker = tmp_path / "imported"
    (d / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    (d / "configuration_evil.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    _edit_config(d, auto_map={"AutoConfig": "configuration_evil.EvilConfig",
                              "AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"})
    load_model(str(d))  # auto_map ignored: architectures selects our Llama
    _edit_config(d, architectures=["EvilForCausalLM"])
    with pytest.raises(UnsupportedError, match="EvilForCausalLM"):
        load_model(str(d))
    assert not marker.exists()


def test_first_supported_architecture_is_used(single_dir, tmp_path):
    d = _copy(single_dir, tmp_path / "m")
    _edit_config(d, architectures=["SomethingElse", "LlamaForCausalLM"])
    _, cfg, _ = load_model(str(d))
    assert cfg.architectures == ("LlamaForCausalLM",)


@pytest.mark.parametrize("text, match", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "JSON object"),
    ('{"hidden_size": NaN}', "not valid JSON"),
    ("[" * 100000 + "]" * 100000, "not valid JSON"),
])
def test_malformed_config_json(single_dir, tmp_path, text, match):
    d = _copy(single_dir, tmp_path / "m")
    (d / "config.json").write_text(text)
    with pytest.raises(ModelLoadError, match=match):
        load_model(str(d))


@pytest.mark.parametrize("changes, match", [
    ({"architectures": "LlamaForCausalLM"}, "architectures"),
    ({"architectures": []}, "architectures"),
    ({"num_hidden_layers": "2"}, "num_hidden_layers"),
    ({"num_hidden_layers": -1}, "num_hidden_layers"),
    ({"num_hidden_layers": True}, "num_hidden_layers"),
    ({"hidden_size": None}, "hidden_size"),
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"rms_norm_eps": "tiny"}, "rms_norm_eps"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "low_freq_factor"),
    ({"rope_scaling": [1]}, "rope_scaling"),
    ({"layer_types": ["full_attention"]}, "layer_types"),
    ({"num_hidden_layers": 200}, "parameters"),  # far more than the checkpoint holds
    ({"vocab_size": 1 << 23, "hidden_size": 4096}, "parameters"),
    ({"max_position_embeddings": 1 << 24, "head_dim": 64}, "rotary table"),
])
def test_bad_config_fields_are_load_errors(single_dir, tmp_path, changes, match):
    d = _copy(single_dir, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg.pop("rope_parameters", None) if "rope_scaling" in changes else None
    cfg.update(changes)
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match=match):
        load_model(str(d))


def test_unknown_rope_type_is_unsupported(single_dir, tmp_path):
    d = _copy(single_dir, tmp_path / "m")
    _edit_config(d, rope_parameters={"rope_type": "longrope", "rope_theta": 1e4})
    with pytest.raises(UnsupportedError, match="longrope"):
        load_model(str(d))


def _state(d: Path) -> dict[str, torch.Tensor]:
    return load_file(d / "model.safetensors")


@pytest.mark.parametrize("edit, err, match", [
    (lambda s: s.pop("model.norm.weight"), ModelLoadError, "missing"),
    (lambda s: s.update({"model.layers.0.extra.weight": torch.zeros(2)}), ModelLoadError,
     "unexpected weight 'model.layers.0.extra.weight'"),
    (lambda s: s.update({"model.norm.weight": torch.zeros(31)}), ModelLoadError,
     "model.norm.weight"),
    (lambda s: s.update({"model.layers.0.self_attn.k_proj.weight": torch.zeros(15, 32)}),
     ModelLoadError, "k_proj"),
    (lambda s: s.update({"model.norm.weight": torch.zeros(32, dtype=torch.int8)}),
     UnsupportedError, "dtype"),
])
def test_bad_checkpoint_tensors(single_dir, tmp_path, edit, err, match):
    d = _copy(single_dir, tmp_path / "m")
    state = _state(d)
    edit(state)
    save_file(state, d / "model.safetensors")
    with pytest.raises(err, match=match):
        load_model(str(d))


def test_duplicate_tensor_across_files(single_dir, tmp_path):
    d = _copy(single_dir, tmp_path / "m")
    save_file({"model.norm.weight": torch.ones(32)}, d / "extra.safetensors")
    with pytest.raises(ModelLoadError, match="duplicate weight 'model.norm.weight'"):
        load_model(str(d))


def test_truncated_safetensors_file(single_dir, tmp_path):
    d = _copy(single_dir, tmp_path / "m")
    data = (d / "model.safetensors").read_bytes()
    for cut in (4, 100, len(data) // 2):
        (d / "model.safetensors").write_bytes(data[:cut])
        with pytest.raises(ModelLoadError, match="safetensors"):
            load_model(str(d))


@pytest.mark.parametrize("weight_map, match", [
    ({"model.norm.weight": "../model.safetensors"}, "bad file name"),
    ({"model.norm.weight": "/etc/passwd"}, "bad file name"),
    ({"model.norm.weight": "model-00003-of-00002.safetensors"},
     "model-00003-of-00002.safetensors"),
    ({}, "weight_map"),
])
def test_bad_index_json(single_dir, tmp_path, weight_map, match):
    d = _copy(single_dir, tmp_path / "m")
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(ModelLoadError, match=match):
        load_model(str(d))


def test_pickle_checkpoints_are_refused(single_dir, tmp_path):
    d = _copy(single_dir, tmp_path / "m")
    (d / "model.safetensors").rename(d / "pytorch_model.bin")
    with pytest.raises(UnsupportedError, match="safetensors"):
        load_model(str(d))


def test_directory_without_model(tmp_path):
    with pytest.raises(ModelLoadError, match="no model found"):
        load_model(str(tmp_path))


def test_transformers4_style_configs_are_normalized():
    """Hub configs written by transformers 4 (rope_theta / rope_scaling / rope_local_base_freq,
    legacy "type", use_sliding_window) give transformers 5's rope_parameters / windows."""
    from libvllm.engine.model_loader.hf_config import arch_config_from_hf

    base = dict(TINY, head_dim=None)
    gemma = arch_config_from_hf(dict(base, rope_theta=1e6, rope_local_base_freq=1e4,
                                     rope_scaling={"rope_type": "linear", "factor": 8.0},
                                     sliding_window=512, num_hidden_layers=6),
                                "Gemma3ForCausalLM", "g")
    assert gemma.layer_rope_parameters(0) == {"rope_type": "default", "rope_theta": 1e4}
    assert gemma.layer_rope_parameters(5) == {"rope_type": "linear", "factor": 8.0,
                                              "rope_theta": 1e6}
    assert gemma.layer_types[:6] == ("sliding_attention",) * 5 + ("full_attention",)
    assert gemma.tie_word_embeddings and gemma.hidden_act == "gelu_pytorch_tanh"
    llama = arch_config_from_hf(dict(base, rope_theta=5e5, rope_scaling={
        "type": "linear", "factor": 2.0}), "LlamaForCausalLM", "l")
    assert llama.rope_parameters == {"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5}
    assert llama.head_dim == 8 and llama.sliding_window is None
    qwen = arch_config_from_hf(dict(base, sliding_window=4096, use_sliding_window=False),
                               "Qwen2ForCausalLM", "q")
    assert qwen.sliding_window is None and qwen.layer_types is None
    mistral = arch_config_from_hf(dict(base), "MistralForCausalLM", "m")
    assert mistral.sliding_window == 4096 and mistral.layer_sliding_window(1) == 4096
    mixtral = arch_config_from_hf(dict(base, num_local_experts=8), "MixtralForCausalLM", "x")
    assert mixtral.num_experts == 8 and mixtral.rope_theta == 1e6
