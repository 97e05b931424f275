"""Malformed FP8 checkpoints and quantization settings: a clear error at load, naming the
tensor or layer, never a crash.

Ports the config checks of vLLM 0.33 tests/quantization/test_fp8.py and
test_compressed_tensors.py (unsupported schemes) and vllm/config/model.py's
_verify_quantization errors (a `quantization` contradicting the checkpoint's, an unknown
quant_method); the malformed-tensor cases follow vllm/model_executor/parameter.py's
loaders (missing or mis-shaped scales, block shapes validate_fp8_block_shape refuses).
Also checks the layout the CUDA path keeps (fp8 weights, stacked scales, dtypes through
.to()), which the CPU path dequantizes.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from libvllm.engine.config import EngineConfig
from libvllm.engine.errors import InvalidArgumentError, ModelLoadError, UnsupportedError
from libvllm.engine.llm_engine import LLMEngine
from libvllm.engine.model_loader import build_model, load_model
from libvllm.engine.model_loader.safetensors_loader import load_hf_model
from tests.fp8_reference import edit_checkpoint, edit_quant_config, write_fp8_pair
from tests.test_models_parity import make_hf_model

pytest.importorskip("transformers")

Q = "model.layers.0.self_attn.q_proj"


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("fp8")
    hf = make_hf_model("llama")
    block = write_fp8_pair(hf, root / "block", "fp8-block", (32, 48))
    channel = write_fp8_pair(hf, root / "channel", "ct-channel")
    (root / "bf16").mkdir()
    make_hf_model("llama", torch.bfloat16).save_pretrained(root / "bf16")
    return {"block": block[0], "channel": channel[0], "bf16": root / "bf16"}


@pytest.fixture
def block_dir(dirs, tmp_path):
    return shutil.copytree(dirs["block"], tmp_path / "m")


@pytest.fixture
def channel_dir(dirs, tmp_path):
    return shutil.copytree(dirs["channel"], tmp_path / "m")


def _drop(name):
    def fn(state):
        del state[name]
        return state
    return fn


def _set(name, value):
    def fn(state):
        state[name] = value(state[name]) if callable(value) else value
        return state
    return fn


@pytest.mark.parametrize("edit, err, match", [
    (_drop(f"{Q}.weight_scale_inv"), ModelLoadError,
     f"FP8 weight {Q}.weight has no scale {Q}.weight_scale_inv"),
    (_set(f"{Q}.weight_scale_inv", torch.ones(2, 1)), ModelLoadError,
     rf"{Q}.weight_scale_inv has shape \[2, 1\], want \[2, 2\]"),
    (_set(f"{Q}.weight", lambda w: w.float().to(torch.bfloat16)), ModelLoadError,
     f"{Q}.weight has dtype torch.bfloat16 but its scale {Q}.weight_scale_inv is stored"),
    (_set(f"{Q}.weight", lambda w: w.float().to(torch.float8_e5m2)), UnsupportedError,
     f"{Q}.weight.*F8_E5M2"),
    (_set(f"{Q}.weight_scale_inv", lambda s: s.to(torch.float64)), UnsupportedError,
     f"{Q}.weight_scale_inv.*F64"),
    (_set("model.layers.0.self_attn.extra.weight_scale_inv", torch.ones(1)), ModelLoadError,
     "scale model.layers.0.self_attn.extra.weight_scale_inv has no weight"),
])
def test_malformed_fp8_tensors(block_dir, edit, err, match):
    edit_checkpoint(block_dir, edit)
    with pytest.raises(err, match=match):
        load_model(str(block_dir))


def test_dense_weight_for_a_quantized_layer(block_dir):
    edit_checkpoint(block_dir, lambda s: {**{k: v for k, v in s.items()
                                             if k != f"{Q}.weight_scale_inv"},
                                          f"{Q}.weight": s[f"{Q}.weight"].float()})
    with pytest.raises(ModelLoadError, match=f"{Q}.weight has dtype torch.float32, want "
                       "float8_e4m3fn"):
        load_model(str(block_dir))


def test_fp8_tensor_without_quantization_config(block_dir):
    cfg = json.loads((block_dir / "config.json").read_text())
    del cfg["quantization_config"]
    (block_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="is float8_e4m3fn but config.json has no FP8"):
        load_model(str(block_dir))


def test_channel_scale_shape_is_checked(channel_dir):
    edit_checkpoint(channel_dir, _set(f"{Q}.weight_scale", torch.ones(3, 1)))
    with pytest.raises(ModelLoadError, match=rf"{Q}.weight_scale has shape \[3, 1\], want "
                       r"\[64, 1\]"):
        load_model(str(channel_dir))


@pytest.mark.parametrize("changes, match", [
    ({"quant_method": "awq"}, r"Unknown quantization method: awq\. Must be one of"),
    ({"fmt": "e5m2"}, "fmt 'e5m2' is not supported"),
    ({"activation_scheme": "sometimes"}, "Unsupported activation scheme sometimes"),
    ({"weight_block_size": [128, 128, 1]}, "must have 2 dimensions, but got 3"),
    ({"weight_block_size": [128, 128], "activation_scheme": "static"},
     "only supports dynamic activation scheme"),
    ({"weight_block_size": [48, 48]}, "qkv_proj: Weight output_partition_size = 64 is not "
     "divisible by weight quantization block_n = 48"),
    ({"weight_block_size": [32, 32]}, r"mlp.down_proj.weight_scale_inv has shape \[2, 2\], "
     r"want \[2, 3\]"),  # written with 48-column blocks: K = 96 is 2 of them, not 3
    ({"modules_to_not_convert": [Q]}, "some but not all shards of "
     "model.layers.0.self_attn.qkv_proj"),
])
def test_bad_fp8_config(block_dir, changes, match):
    edit_quant_config(block_dir, **changes)
    with pytest.raises(ModelLoadError, match=match):
        load_model(str(block_dir))


def _group(d, **changes):
    cfg = json.loads((d / "config.json").read_text())
    group = cfg["quantization_config"]["config_groups"]["group_0"]
    for part, fields in changes.items():
        group[part] = None if fields is None else {**group[part], **fields}
    (d / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("changes", [
    {"weights": {"num_bits": 4}}, {"weights": {"type": "int"}},
    {"weights": {"strategy": "group", "group_size": 128}}, {"weights": {"symmetric": False}},
    {"input_activations": None}, {"input_activations": {"dynamic": False}},
])
def test_unsupported_compressed_tensors_schemes(channel_dir, changes):
    _group(channel_dir, **changes)
    with pytest.raises(ModelLoadError, match="No compressed-tensors compatible scheme"):
        load_model(str(channel_dir))


def test_quantization_argument_must_match_the_checkpoint(dirs):
    with pytest.raises(InvalidArgumentError, match=r"model config \(fp8\) does not match the "
                       r"quantization method specified in the `quantization` argument "
                       r"\(compressed-tensors\)"):
        load_model(str(dirs["block"]), quantization="compressed-tensors")
    with pytest.raises(InvalidArgumentError, match=r"\(compressed-tensors\) does not match"):
        load_model(str(dirs["channel"]), quantization="fp8")
    with pytest.raises(ModelLoadError, match="Cannot find the config file for "
                       "compressed-tensors"):
        load_model(str(dirs["bf16"]), quantization="compressed-tensors")
    model, _, _ = load_model(str(dirs["block"]), quantization="fp8")  # the same method
    assert model.model.layers[0].self_attn.qkv_proj.weight.dtype == torch.float32


def test_gguf_with_quantization_is_vllms_mismatch(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF")
    with pytest.raises(InvalidArgumentError, match=r"model config \(gguf\) does not match"):
        load_model(str(path), quantization="fp8")


def test_cuda_layout_keeps_fp8_weights_and_stacked_scales(dirs):
    """The layout the CUDA path runs (process_weights_after_loading for a CUDA device
    only decides what is kept), and its dtypes through .to(dtype)."""
    dense, _, _ = load_model(str(dirs["block"]))
    model, _ = load_hf_model(str(dirs["block"]), build_model, None, torch.device("cuda"))
    model.to(dtype=torch.bfloat16)
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert attn.qkv_proj.weight.dtype == torch.float8_e4m3fn
    assert attn.qkv_proj.weight_scale_inv.dtype == torch.float32
    # q 64 + k 32 + v 32 rows in 32-row blocks, K = 64 in 48-column blocks
    assert tuple(attn.qkv_proj.weight_scale_inv.shape) == (4, 2)
    assert tuple(mlp.gate_up_proj.weight_scale_inv.shape) == (6, 2)
    assert tuple(mlp.down_proj.weight_scale_inv.shape) == (2, 2)
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16
    for name in ("qkv_proj", "o_proj"):
        layer = getattr(attn, name)
        got = layer.quant_method.dequantize(layer)
        assert torch.equal(got, getattr(dense.model.layers[0].self_attn, name).weight)


def test_engine_config_quantization_reaches_the_loader(dirs):
    """EngineConfig.quantization (vLLM's --quantization) is what the engine core loads
    with: a contradiction fails engine creation with vLLM's error."""
    with pytest.raises(InvalidArgumentError, match=r"\(fp8\) does not match"):
        LLMEngine.from_config(EngineConfig(str(dirs["block"]), device="cpu",
                                           skip_tokenizer_init=True,
                                           quantization="compressed-tensors"))


def test_cuda_layout_per_tensor_shards_share_their_max_scale(tmp_path):
    """vLLM's requantize_with_max_scale: q, k, v (each with its own scale and static
    input scale) become one fp8 weight under the largest scale, one input scale."""
    fp8_dir, _ = write_fp8_pair(make_hf_model("llama"), tmp_path, "ct-tensor")
    dense, _, _ = load_model(str(fp8_dir))
    model, _ = load_hf_model(str(fp8_dir), build_model, None, torch.device("cuda"))
    qkv = model.model.layers[0].self_attn.qkv_proj
    assert qkv.weight.dtype == torch.float8_e4m3fn
    assert qkv.weight_scale.numel() == 1 and qkv.input_scale.numel() == 1
    want = dense.model.layers[0].self_attn.qkv_proj.weight
    got = qkv.weight.float() * qkv.weight_scale
    assert ((got - want).abs() <= want.abs() / 8 + qkv.weight_scale).all()  # one fp8 step


def test_cuda_layout_of_block_fp8_experts(tmp_path):
    fp8_dir, _ = write_fp8_pair(make_hf_model("qwen3_moe"), tmp_path, "fp8-block", (16, 32))
    dense, _, _ = load_model(str(fp8_dir))
    model, _ = load_hf_model(str(fp8_dir), build_model, None, torch.device("cuda"))
    experts = model.model.layers[0].mlp.experts
    # 8 experts, I = 32 (2 x 2 blocks of 16 rows for gate | up), H = 64 (2 of 32 columns)
    assert tuple(experts.w13_weight_scale_inv.shape) == (8, 4, 2)
    assert tuple(experts.w2_weight_scale_inv.shape) == (8, 4, 1)
    got = experts.quant_method._dequantize(experts.w13_weight, experts.w13_weight_scale_inv,
                                           True)
    assert torch.equal(got, dense.model.layers[0].mlp.experts.w13_weight)
