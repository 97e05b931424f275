"""The fp32 FP8 emulation of tests/fp8_emulation.py, the oracle of the GPU accuracy
acceptance (tests/test_fp8_accuracy_gpu.py), checked on the CPU.

(a) While active it rounds the input of exactly the quantized linears, each once per
forward: Llama's q/k/v/o/gate/up/down, Qwen3-MoE's fused experts (one call per routed
expert of each of gate_up_proj / down_proj), Qwen3.5-MoE's GDN in_proj_qkv / in_proj_z /
out_proj and shared expert too; the rounded input is the kernels' reference rounding
(kernels/fp8_quant.py per_token_group_quant_fp8_ref per group of block_k, scaled_fp8_quant_ref
per token or with the static input_scale) dequantized, and the linear runs on it; lm_head,
the routers, the embeddings, GDN in_proj_a / in_proj_b and the shared-expert gate see their
exact input. (b) With the rounding off, transformers fp32 on the dequantized twin and the
CPU engine (fp32, which dequantizes the FP8 checkpoint at load) agree on every
teacher-forced top-1. (c) The rounding changes the logits, so the acceptance can fail.
(d) The acceptance's models (tests/fp8_conditioning.py, tied embeddings, matrices of
WEIGHT_STD) are well conditioned: < 1 % of the positions are near-ties, the emulation in
bf16 and in fp64 agrees with the fp32 one on >= 0.99, and the twin criterion holds for
transformers' bf16 stand-ins; the same weights untied are not (near-ties > 5 %).

Mirrors vLLM 0.33 tests/quantization/test_fp8.py (FP8 layers against a dequantized
reference) on tiny random models; checkpoints from tests/fp8_reference.py.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from torch import nn

from libvllm.engine.config import EngineConfig
from libvllm.engine.llm_engine import LLMEngine
from libvllm.kernels.fp8_quant import per_token_group_quant_fp8_ref, scaled_fp8_quant_ref
from tests.fp8_conditioning import CASES, MAX_MEAN_LOGPROB_GAP, measure
from tests.fp8_emulation import (
    Fp8Emulation,
    agreement,
    engine_top1,
    hf_top1,
    random_prompts,
    round_activations,
)
from tests.fp8_reference import INPUT_SCALE, write_fp8_pair
from tests.test_models_hybrid_gdn import make_hf_model as make_hybrid
from tests.test_models_parity import make_hf_model

BLOCKS = {"llama": (32, 32), "qwen3_moe": (32, 32), "qwen3_5_moe": (16, 16)}  # divide every K
ATTENTION = {"q_proj", "k_proj", "v_proj", "o_proj"}
MLP = {"gate_proj", "up_proj", "down_proj"}
ROUNDED = {"llama": ATTENTION | MLP, "qwen3_moe": ATTENTION | MLP,
           "qwen3_5_moe": ATTENTION | MLP | {"in_proj_qkv", "in_proj_z", "out_proj"}}
EXACT = {"llama": {"lm_head"}, "qwen3_moe": {"lm_head"},  # nn.Linear modules left alone
         "qwen3_5_moe": {"lm_head", "in_proj_a", "in_proj_b", "shared_expert_gate"}}
MOE_LAYERS = {"llama": 0, "qwen3_moe": 1, "qwen3_5_moe": 8}  # Qwen3-MoE's layer 1 is dense
PROMPT = list(range(3, 60, 3))


def _hf(family: str):
    return make_hybrid(family) if family == "qwen3_5_moe" else make_hf_model(family)


def _expected_rounding(x: torch.Tensor, scheme: str, block_k: int) -> torch.Tensor:
    """The kernels' reference quantizer of `scheme` on x [..., K], dequantized."""
    x2 = x.reshape(-1, x.shape[-1])  # [M, K]
    if scheme == "fp8-block":
        q, s = per_token_group_quant_fp8_ref(x2, block_k)  # [M, K], [M, K / bk]
        deq = (q.float().unflatten(1, (-1, block_k)) * s[..., None]).flatten(1)
    else:
        static = torch.tensor([INPUT_SCALE]) if scheme == "ct-tensor" else None
        q, s = scaled_fp8_quant_ref(x2, static, use_per_token_if_dynamic=True)
        deq = q.float() * s  # s [M, 1] per token or [1] static
    return deq.reshape(x.shape)


def _routed_experts(hf) -> tuple[dict[str, int], list]:
    """Forward hooks: experts module name -> distinct experts its router picked."""
    hits, handles = {}, []
    for name, m in hf.named_modules():
        if hasattr(m, "gate_up_proj"):
            router = hf.get_submodule(name.rpartition(".")[0] + ".gate")

            def hook(mod, args, out, name=name):
                hits[name] = out[2].unique().numel()  # (logits, scores, indices [T, k])
                assert torch.equal(out[0], nn.functional.linear(args[0], mod.weight))

            handles.append(router.register_forward_hook(hook))
    return hits, handles


@pytest.mark.parametrize("family, scheme", [("llama", "ct-tensor"), ("qwen3_moe", "fp8-block"),
                                            ("qwen3_moe", "ct-channel"),
                                            ("qwen3_5_moe", "fp8-block")])
def test_rounds_exactly_the_quantized_linears(family, scheme):
    hf, block_k = _hf(family), BLOCKS[family][1]
    experts_impl = hf.config._experts_implementation
    hits, handles = _routed_experts(hf)
    seen = {}
    for name in ("lm_head", "model.layers.0.self_attn.o_proj" if family != "qwen3_5_moe"
                 else "model.layers.0.linear_attn.out_proj"):
        handles.append(hf.get_submodule(name).register_forward_hook(
            lambda m, args, out, name=name: seen.__setitem__(name, (args[0], out))))
    with Fp8Emulation(hf, scheme, BLOCKS[family], record=True) as emu:
        hf_top1(hf, [PROMPT])
    for h in handles:
        h.remove()
    assert torch.nn.functional.linear is not emu._linear
    assert hf.config._experts_implementation == experts_impl

    linears = {n: n.rpartition(".")[2] for n, m in hf.named_modules() if isinstance(m, nn.Linear)}
    assert {leaf for leaf in linears.values() if leaf not in ROUNDED[family]} == EXACT[family]
    want = {f"{n}.weight": 1 for n, leaf in linears.items() if leaf in ROUNDED[family]}
    want.update({f"{n}.{w}": k for n, k in hits.items() for w in ("gate_up_proj", "down_proj")})
    assert len(hits) == MOE_LAYERS[family]
    assert dict(emu.counts) == want  # no embeddings, lm_head, routers, GDN a/b, gates
    assert sum(emu.counts.values()) == len(emu.records)
    for name, x, xr in emu.records:
        assert torch.equal(xr, _expected_rounding(x, scheme, block_k)), name
        assert not torch.equal(xr, x), name
    x, out = seen["lm_head"]  # its input not rounded
    assert torch.equal(out, nn.functional.linear(x, hf.lm_head.weight))
    (name, (x, out)), = ((n, v) for n, v in seen.items() if n != "lm_head")
    xr = next(r for n, i, r in emu.records if n == f"{name}.weight" and torch.equal(i, x))
    assert torch.equal(out, nn.functional.linear(xr, hf.get_submodule(name).weight))


@pytest.mark.parametrize("family, scheme", [("llama", "fp8-block"), ("llama", "ct-tensor"),
                                            ("qwen3_moe", "fp8-block"),
                                            ("qwen3_moe", "ct-channel")])
def test_unrounded_emulation_equals_the_cpu_engine_on_the_fp8_checkpoint(family, scheme,
                                                                        tmp_path):
    fp8_dir, twin_dir = write_fp8_pair(_hf(family), tmp_path, scheme, BLOCKS[family])
    hf = transformers.AutoModelForCausalLM.from_pretrained(twin_dir, dtype=torch.float32)
    prompts = random_prompts(3, 24, hf.config.vocab_size)
    with Fp8Emulation(hf.eval(), scheme, BLOCKS[family], rounding=False) as emu:
        want = hf_top1(hf, prompts)
    assert emu.counts and not emu.records  # the quantized linears ran, none rounded
    engine = LLMEngine.from_config(EngineConfig(str(fp8_dir), device="cpu",
                                                skip_tokenizer_init=True, max_num_seqs=4,
                                                kv_cache_memory_bytes=32 << 20))
    try:
        got = engine_top1(engine, prompts)
    finally:
        engine.shutdown()
    assert [len(r) for r in got] == [23] * 3
    assert agreement(got, want) == 1.0


@pytest.mark.parametrize("family, scheme", [("llama", "fp8-block"), ("llama", "ct-channel"),
                                            ("llama", "ct-tensor"), ("qwen3_moe", "fp8-block")])
def test_the_rounding_changes_the_logits(family, scheme):
    hf = _hf(family)
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        with Fp8Emulation(hf, scheme, BLOCKS[family], rounding=False):
            plain = hf(ids, attention_mask=torch.ones_like(ids)).logits
        with Fp8Emulation(hf, scheme, BLOCKS[family]):
            rounded = hf(ids, attention_mask=torch.ones_like(ids)).logits
    assert (plain - rounded).abs().max().item() > 1e-3


@pytest.mark.parametrize("family, scheme", CASES)
def test_the_acceptance_models_are_well_conditioned(family, scheme):
    c = measure(family, scheme)
    assert c.near_ties < 0.01
    assert c.bf16 >= 0.99 and c.fp64 >= 0.99
    assert c.twin >= c.twin_ref - 0.02
    # the logprob bound passes an fp32 engine's noise and fails an error the size of the
    # FP8 rounding (which the top-1 agreement lets through: rounding_off >= 0.99)
    assert c.lp_fp64 < MAX_MEAN_LOGPROB_GAP[family] < c.lp_rounding_off


def test_untied_random_logits_are_near_ties():
    assert measure("llama", "fp8-block", tied=False).near_ties > 0.05


def test_bad_scheme_or_partial_group_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown FP8 scheme"):
        Fp8Emulation(make_hf_model("llama"), "int8")
    with pytest.raises(ValueError, match="not a multiple of block_k"):
        round_activations(torch.ones(2, 48), "fp8-block", 32)
