"""FP8 checkpoints load and run as the fp32 model of their dequantized weights.

Ports vLLM 0.33 tests/quantization/test_fp8.py (test_load_fp16_model: online `fp8`
quantizes an unquantized checkpoint's linear weights; block-FP8 checkpoints load) and
tests/quantization/test_compressed_tensors.py (test_compressed_tensors_fp8: per-channel
dynamic and per-tensor static FP8 checkpoints) to tiny random models: Llama, Qwen3-MoE
and Qwen3.5-MoE (hybrid GDN), written by tests/fp8_reference.py (block absmax / 448 per
bn x bk block; per channel / per tensor for compressed-tensors). Oracle: transformers
fp32 loaded from the twin directory holding the dequantized FP8 weights. On the CPU the
engine dequantizes once at load, so prompt logits agree to 1e-4 and 32 greedy tokens are
equal; the layer layout (fp8 parameters, scales stacked into qkv / gate_up / w13) is what
that load goes through.
"""

from __future__ import annotations

import pytest
import torch

from libvllm.engine.model_loader import load_model
from tests.fp8_reference import quant, write_fp8_pair
from tests.test_models_hybrid_gdn import OneRequest
from tests.test_models_hybrid_gdn import make_hf_model as make_hybrid
from tests.test_models_parity import generate_greedy, make_hf_model, prompt_logits

transformers = pytest.importorskip("transformers")

STEPS = 32
CASES = {  # name -> (model family, scheme, block)
    "llama-block": ("llama", "fp8-block", (32, 48)),  # K = 64, 96: partial last blocks
    "llama-ct-channel": ("llama", "ct-channel", None),
    "llama-ct-tensor-static": ("llama", "ct-tensor", None),
    "qwen3_moe-block": ("qwen3_moe", "fp8-block", (32, 32)),
    "qwen3_moe-ct-channel": ("qwen3_moe", "ct-channel", None),
    "qwen3_moe-ct-block": ("qwen3_moe", "ct-block", (32, 32)),
    "qwen3_5_moe-block": ("qwen3_5_moe", "fp8-block", (16, 32)),
}


def _hf(family: str):
    return make_hybrid(family) if family == "qwen3_5_moe" else make_hf_model(family)


def _check_greedy(ours, cfg, oracle, family: str) -> None:
    ids = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, cfg.vocab_size, (11,), generator=ids).tolist()
    t = torch.tensor([prompt])  # an explicit mask: token 0 is the pad id
    with torch.no_grad():
        ref = oracle.generate(t, attention_mask=torch.ones_like(t), max_new_tokens=STEPS,
                              do_sample=False)[0, len(prompt):].tolist()
    if family == "qwen3_5_moe":
        req, got, nxt = OneRequest(ours, cfg, len(prompt) + STEPS + 1), [], prompt
        for _ in range(STEPS):
            tok = int(req.forward(nxt)[-1].argmax())
            got.append(tok)
            nxt = [tok]
    else:
        got = generate_greedy(ours, cfg, [prompt], max_tokens=STEPS)[0]
    assert got == ref


@pytest.mark.parametrize("case", list(CASES))
def test_fp8_checkpoint_matches_dequantized_fp32(case, tmp_path):
    family, scheme, block = CASES[case]
    fp8_dir, twin_dir = write_fp8_pair(_hf(family), tmp_path, scheme, block or (128, 128))
    ours, cfg, _ = load_model(str(fp8_dir))
    oracle = transformers.AutoModelForCausalLM.from_pretrained(twin_dir).eval()
    prompt = list(range(3, 40, 2))
    with torch.no_grad():
        ref = oracle(torch.tensor([prompt])).logits[0]
    if family == "qwen3_5_moe":
        with torch.inference_mode():
            got = OneRequest(ours, cfg, 64).forward(prompt)
    else:
        got = prompt_logits(ours, cfg, prompt)
    assert (got - ref).abs().max().item() < 1e-4
    _check_greedy(ours, cfg, oracle, family)


def _online_reference(hf) -> None:
    """vLLM's online per-tensor FP8 on the oracle: one amax / 448 scale per linear layer
    of ours (q/k/v together, gate/up together, per expert gate|up and down)."""
    def qdq(ws: list[torch.Tensor]) -> list[torch.Tensor]:
        scale = (max(w.abs().amax() for w in ws).float() / 448.0).reshape(1)
        return [quant(w, scale).float() * scale for w in ws]

    with torch.no_grad():
        for layer in hf.model.layers:
            a = layer.self_attn
            ws = qdq([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])
            for lin, w in zip((a.q_proj, a.k_proj, a.v_proj), ws):
                lin.weight.copy_(w)
            a.o_proj.weight.copy_(qdq([a.o_proj.weight])[0])
            mlp = layer.mlp
            if hasattr(mlp, "experts"):  # fused [E, 2I, H] / [E, H, I] in transformers
                for e in range(mlp.experts.gate_up_proj.shape[0]):
                    mlp.experts.gate_up_proj[e] = qdq([mlp.experts.gate_up_proj[e]])[0]
                    mlp.experts.down_proj[e] = qdq([mlp.experts.down_proj[e]])[0]
            else:
                g, u = qdq([mlp.gate_proj.weight, mlp.up_proj.weight])
                mlp.gate_proj.weight.copy_(g)
                mlp.up_proj.weight.copy_(u)
                mlp.down_proj.weight.copy_(qdq([mlp.down_proj.weight])[0])


@pytest.mark.parametrize("family", ["llama", "qwen3_moe"])
def test_online_fp8_quantizes_an_unquantized_checkpoint(family, tmp_path):
    make_hf_model(family, torch.bfloat16).save_pretrained(tmp_path)  # bf16, as vLLM's test
    ours, cfg, _ = load_model(str(tmp_path), quantization="fp8")
    plain, _, _ = load_model(str(tmp_path))
    oracle = make_hf_model(family)  # fp32 (its rope tables too), weights as in the file
    with torch.no_grad():
        for p in oracle.parameters():
            p.copy_(p.bfloat16().float())
    _online_reference(oracle)
    prompt = list(range(5, 30))
    with torch.no_grad():
        ref = oracle(torch.tensor([prompt])).logits[0]
    got = prompt_logits(ours, cfg, prompt)
    assert (got - ref).abs().max().item() < 1e-4
    # the quantization changed the weights (the test would pass on a no-op otherwise)
    assert (prompt_logits(plain, cfg, prompt) - ref).abs().max().item() > 1e-3
    _check_greedy(ours, cfg, oracle, family)
