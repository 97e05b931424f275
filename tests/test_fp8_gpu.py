"""FP8 checkpoints on CUDA: fp8 weights kept, the FP8 kernels against the dequantized
dense path, and the engine end to end (gpu).

Mirrors vLLM 0.33 tests/quantization/test_fp8.py (test_kv_cache_model_load_and_run /
test_load_fp16_model: the layers hold float8_e4m3fn weights and run) and
test_compressed_tensors.py (test_compressed_tensors_fp8). Checkpoints from
tests/fp8_reference.py with 128 x 128 blocks on shapes the kernels tile (every K a
multiple of 128). Each quantized layer's output is compared with the same layer of the
CPU-dequantized model in bf16 (the only difference is the FP8 rounding of the
activations: relative error < 6e-2); the engine's greedy tokens with CUDA graphs equal
its enforce_eager ones. The kernels are kernels/fp8_quant.py, fp8_block_gemm.py,
fp8_scaled_mm.py and fused_moe.py fused_experts(use_fp8_w8a8=True).
"""

from __future__ import annotations

import pytest
import torch

from libvllm.engine.config import EngineConfig
from libvllm.engine.llm_engine import LLMEngine
from libvllm.engine.model_loader import load_model
from libvllm.engine.sampling_params import SamplingParams
from tests.fp8_reference import write_fp8_pair
from tests.test_models_hybrid_gdn import make_hf_model as make_hybrid
from tests.test_models_parity import make_hf_model

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("in_process_core"),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
transformers = pytest.importorskip("transformers")

SHAPES = {"llama": dict(hidden_size=256, intermediate_size=512),
          "qwen3_moe": dict(hidden_size=256, head_dim=64, moe_intermediate_size=128,
                            intermediate_size=512),
          "qwen3_5_moe": dict(hidden_size=256, head_dim=64, moe_intermediate_size=128,
                              shared_expert_intermediate_size=128, linear_value_head_dim=32,
                              linear_key_head_dim=32)}
CASES = [("llama", "fp8-block"), ("llama", "ct-channel"), ("llama", "ct-tensor"),
         ("qwen3_moe", "fp8-block"), ("qwen3_moe", "ct-channel"), ("qwen3_5_moe", "fp8-block")]


def _hf(family: str, **kw):
    """The family's model at SHAPES; kw: the builder's weight_std and config overrides."""
    kw = {**SHAPES[family], **kw}
    return make_hybrid(family, **kw) if family == "qwen3_5_moe" else make_hf_model(family, **kw)


def _rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


def _compare_layers(path: str) -> int:
    """Each FP8 layer of the CUDA model against the CPU-dequantized one; returns how many."""
    cuda, _, _ = load_model(path, device=torch.device("cuda"), dtype=torch.bfloat16)
    cuda = cuda.to("cuda", torch.bfloat16)
    dense, _, _ = load_model(path)
    dense = dense.to("cuda", torch.bfloat16)
    ref_modules, n = dict(dense.named_modules()), 0
    g = torch.Generator(device="cuda").manual_seed(0)
    with torch.inference_mode():
        for name, layer in cuda.named_modules():
            if getattr(layer, "quant_method", None) is None:
                continue
            n += 1
            want = ref_modules[name]
            for m in (1, 8, 40):
                if hasattr(layer, "w13_weight"):
                    assert layer.w13_weight.dtype == torch.float8_e4m3fn
                    h = layer.w2_weight.shape[1]
                    x = torch.randn(m, h, device="cuda", dtype=torch.bfloat16, generator=g)
                    logits = torch.randn(m, layer.num_experts, device="cuda", generator=g)
                    got, ref = layer.routed_experts(x, logits), want.routed_experts(x, logits)
                else:
                    assert layer.weight.dtype == torch.float8_e4m3fn and layer.weight.is_cuda
                    x = torch.randn(m, layer.input_size, device="cuda", dtype=torch.bfloat16,
                                    generator=g)
                    got, ref = layer(x), want(x)
                assert got.dtype == torch.bfloat16 and _rel(got, ref) < 6e-2, (name, m)
    return n


@pytest.mark.parametrize("family, scheme", CASES)
def test_fp8_layers_on_cuda_match_the_dequantized_dense_ones(family, scheme, tmp_path):
    fp8_dir, _ = write_fp8_pair(_hf(family), tmp_path, scheme, (128, 128))
    assert _compare_layers(str(fp8_dir)) > 0


def test_online_fp8_layers_on_cuda(tmp_path):
    make_hf_model("llama", torch.bfloat16, **SHAPES["llama"]).save_pretrained(tmp_path)
    cuda, _, _ = load_model(str(tmp_path), device=torch.device("cuda"), dtype=torch.bfloat16,
                            quantization="fp8")
    layer = cuda.to("cuda", torch.bfloat16).model.layers[0].mlp.down_proj
    assert layer.weight.dtype == torch.float8_e4m3fn and layer.weight_scale.numel() == 1


def _greedy(path: str, eager: bool) -> list[list[int]]:
    engine = LLMEngine.from_config(EngineConfig(path, device="cuda", skip_tokenizer_init=True,
                                                enforce_eager=eager, max_num_seqs=4,
                                                kv_cache_memory_bytes=32 << 20))
    for i in range(3):
        engine.add_request(str(i), [(5 * i + j) % 300 for j in range(9 + 4 * i)],
                           SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))
    out = {}
    while engine.has_unfinished_requests():
        out.update({o.request_id: o.outputs[0].token_ids for o in engine.step() if o.finished})
    return [out[str(i)] for i in range(3)]


@pytest.mark.parametrize("family", ["llama", "qwen3_moe"])
def test_engine_greedy_with_cuda_graphs_equals_eager(family, tmp_path):
    fp8_dir, _ = write_fp8_pair(_hf(family), tmp_path, "fp8-block", (128, 128))
    assert _greedy(str(fp8_dir), eager=False) == _greedy(str(fp8_dir), eager=True)
