"""FusedMoE with a sigmoid-gated shared expert (SharedExpertMLP) against transformers'
Qwen2MoeSparseMoeBlock on the same weights.

Mirrors vLLM 0.33 models/qwen2_moe.py (Qwen2MoeSparseMoeBlock: router gate, FusedMoE with
`shared_experts` = Qwen2MoeMLP carrying the block's `shared_expert_gate`), the layer
Qwen3-Next uses too. Oracle: transformers' block (fp32). On CPU the engine's host path;
on CUDA (gpu) the Triton path in bf16.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from libvllm.engine.layers.fused_moe import FusedMoE, SharedExpertMLP
from libvllm.engine.layers.linear import ReplicatedLinear

transformers = pytest.importorskip("transformers")


class Qwen2MoeSparseMoeBlock(nn.Module):
    """vLLM's block, built from the engine's layers."""

    def __init__(self, cfg) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.gate = ReplicatedLinear(h, cfg.num_experts)
        self.shared_expert_gate = ReplicatedLinear(h, 1)
        self.shared_expert = SharedExpertMLP(h, cfg.shared_expert_intermediate_size,
                                             cfg.hidden_act, self.shared_expert_gate)
        self.experts = FusedMoE(cfg.num_experts, cfg.num_experts_per_tok, h,
                                cfg.moe_intermediate_size, renormalize=cfg.norm_topk_prob,
                                shared_experts=self.shared_expert)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.experts(x, self.gate(x))


def _pair(norm_topk_prob: bool):
    from transformers.models.qwen2_moe.modeling_qwen2_moe import (
        Qwen2MoeSparseMoeBlock as HFBlock,
    )
    cfg = transformers.Qwen2MoeConfig(hidden_size=64, moe_intermediate_size=32,
                                      shared_expert_intermediate_size=48, num_experts=8,
                                      num_experts_per_tok=2, norm_topk_prob=norm_topk_prob)
    torch.manual_seed(0)
    hf = HFBlock(cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.2)
    ours = Qwen2MoeSparseMoeBlock(cfg)
    sd = hf.state_dict()
    with torch.no_grad():
        ours.gate.weight.copy_(sd["gate.weight"])
        ours.shared_expert_gate.weight.copy_(sd["shared_expert_gate.weight"])
        ours.experts.w13_weight.copy_(sd["experts.gate_up_proj"])  # [E, 2I, H], gate first
        ours.experts.w2_weight.copy_(sd["experts.down_proj"])
        ours.shared_expert.gate_up_proj.weight.copy_(torch.cat(
            [sd["shared_expert.gate_proj.weight"], sd["shared_expert.up_proj.weight"]]))
        ours.shared_expert.down_proj.weight.copy_(sd["shared_expert.down_proj.weight"])
    return hf, ours


@pytest.mark.parametrize("norm_topk_prob", [False, True])
def test_shared_expert_block_matches_transformers(norm_topk_prob) -> None:
    hf, ours = _pair(norm_topk_prob)
    x = torch.randn(7, 64)
    with torch.no_grad():
        want = hf(x[None])[0]
        got = ours(x)
    assert (got - want).abs().max().item() < 1e-5
    # the gate is owned by the block: one parameter, under the checkpoint's name
    names = [n for n, _ in ours.named_parameters()]
    assert "shared_expert_gate.weight" in names
    assert not any("expert_gate" in n and n != "shared_expert_gate.weight" for n in names)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_shared_expert_block_on_cuda_bf16() -> None:
    hf, ours = _pair(True)
    ours = ours.to("cuda", torch.bfloat16)
    for n in (1, 33):
        x = torch.randn(n, 64)
        with torch.no_grad():
            want = hf(x[None])[0]
            got = ours(x.to("cuda", torch.bfloat16)).float().cpu()
        assert ((got - want).abs().max() / want.abs().max()).item() < 3e-2
