"""Qwen3-Next, Qwen3.5 and Qwen3.5-MoE (engine/models/qwen3_next.py, qwen3_5.py,
qwen3_5_moe.py) against transformers fp32 on CPU, on tiny random configs saved with
save_pretrained: prompt logits within 1e-4, then 32 cached decode steps (teacher-forced
with transformers' greedy tokens) within 1e-4 and greedy tokens equal. Also the fused 3-D
expert layout of Qwen3.5-MoE checkpoints, the multimodal wrapper's text-only names
(`model.language_model.`, `model.visual.*`, `mtp.*`) and the Qwen3-Next interleaved
in-projections.

Mirrors vLLM 0.33 tests/models/language/generation/test_hybrid.py (HF vs vLLM on
tiny-random/qwen3-next-moe) with locally built configs (the Hub is unreachable).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import replace

import pytest
import torch

if not torch.cuda.is_available():  # before kernels/ are imported: the Triton path on CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

from libvllm.engine.layers.attention import AttentionMetadata  # noqa: E402
from libvllm.engine.model_loader import load_model  # noqa: E402
from libvllm.engine.worker.mamba_utils import (  # noqa: E402
    allocate_hybrid_kv_cache,
    hybrid_kv_cache_config,
)
from libvllm.engine.worker.model_runner import ModelRunner  # noqa: E402

transformers = pytest.importorskip("transformers")

COMMON = dict(vocab_size=128, hidden_size=64, num_hidden_layers=8, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
              linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8,
              linear_conv_kernel_dim=4, max_position_embeddings=512)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
           shared_expert_intermediate_size=48)
FAMILIES = {
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM", dict(intermediate_size=96, **MOE)),
    "qwen3_5": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", dict(intermediate_size=96)),
    "qwen3_5_moe": ("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM", MOE),
}
DECODE_STEPS = 32
BLOCK = 8


def make_hf_model(family: str, weight_std: float = 0.2, **overrides):
    """The family's tiny model: matrices N(0, weight_std), A_log / dt_bias U(-1, 0.5),
    other vectors U(-0.3, 0.3); overrides go to the config."""
    cfg_cls, model_cls, extra = FAMILIES[family]
    cfg = getattr(transformers, cfg_cls)(**{**COMMON, **extra, **overrides})
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "A_log" in name or "dt_bias" in name:
                p.uniform_(-1.0, 0.5)
            elif p.dim() > 1:
                p.normal_(0, weight_std)
            else:
                p.uniform_(-0.3, 0.3)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval()


@pytest.fixture(scope="module", params=list(FAMILIES))
def pair(request, tmp_path_factory):
    hf = make_hf_model(request.param)
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    ours, cfg, _ = load_model(str(path))
    return request.param, hf, ours, cfg, path


class OneRequest:
    """Drives our model for one request: the hybrid block pool (engine/worker/mamba_utils.py)
    with paged KV for attention layers and one state block per GDN group."""

    def __init__(self, model, cfg, max_len: int) -> None:
        cpu = torch.device("cpu")
        hybrid = hybrid_kv_cache_config(cfg, next(model.parameters()).dtype, BLOCK)
        self.block = bs = hybrid.attn_spec.block_size  # raised: a page holds a state
        nblocks = math.ceil(max_len / bs)
        groups = len(hybrid.mamba_groups)
        hybrid = replace(hybrid, num_blocks=nblocks + 1 + groups)
        self.runner = ModelRunner(model, None, cpu, bs, max_num_reqs=2)
        self.runner.initialize_kv_cache(allocate_hybrid_kv_cache(hybrid, cpu), hybrid)
        self.runner.mamba.add("r", list(range(nblocks + 1, nblocks + 1 + groups)), 0)
        self.model = model
        self.table = torch.arange(1, nblocks + 1, dtype=torch.int32)[None]
        self.pos = 0

    @torch.inference_mode()
    def forward(self, ids: list[int]) -> torch.Tensor:
        n, p, bs = len(ids), self.pos, self.block
        positions = torch.arange(p, p + n)
        slots = (positions // bs + 1) * bs + positions % bs
        md = AttentionMetadata(n, slots, [0, n], [p + n], self.table)
        md.gdn = self.runner.mamba.build_metadata(["r"], [p], [0, n], n,
                                                  torch.tensor([0, n], dtype=torch.int32))
        self.pos += n
        return self.model.compute_logits(self.model(torch.tensor(ids), positions, md))


def test_config_reads_gdn_fields(pair):
    family, hf, _, cfg, _ = pair
    assert cfg.architectures == (hf.config.architectures[0],)
    assert cfg.layer_types.count("linear_attention") == 6
    assert (cfg.linear_num_key_heads, cfg.linear_num_value_heads) == (2, 4)


def test_prefill_and_decode_logits_match_transformers(pair):
    _, hf, ours, cfg, _ = pair
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (21,), generator=g).tolist()
    with torch.no_grad():
        ref_prompt = hf(torch.tensor([ids])).logits[0]
        t = torch.tensor([ids])  # an explicit mask: token 0 is the pad id
        gen = hf.generate(t, attention_mask=torch.ones_like(t), max_new_tokens=DECODE_STEPS + 1,
                          do_sample=False,
                          output_logits=True, return_dict_in_generate=True)
    drv = OneRequest(ours, cfg, len(ids) + DECODE_STEPS + 2)
    got = drv.forward(ids)
    assert (got - ref_prompt).abs().max().item() < 1e-4
    tokens = gen.sequences[0, len(ids):].tolist()
    for step in range(DECODE_STEPS):
        logits = drv.forward([tokens[step]])[0]
        ref = gen.logits[step + 1][0]
        assert (logits - ref).abs().max().item() < 1e-4, f"decode step {step}"
        assert int(logits.argmax()) == tokens[step + 1]


def test_chunked_prefill_continues_the_state(pair):
    _, _, ours, cfg, _ = pair
    ids = torch.randint(0, cfg.vocab_size, (30,), generator=torch.Generator().manual_seed(2))
    whole = OneRequest(ours, cfg, 40).forward(ids.tolist())[-1]
    drv = OneRequest(ours, cfg, 40)
    for lo in range(0, 30, 7):
        last = drv.forward(ids[lo:lo + 7].tolist())[-1]
    assert (last - whole).abs().max().item() < 1e-4


def test_triton_path_matches_torch_path(pair, monkeypatch):
    """The GDN layer's kernel path (Triton, here under TRITON_INTERPRET) gives the logits
    of its torch path: prefill, then decode steps."""
    import libvllm.engine.layers.gdn as gdn
    from libvllm.kernels.gated_delta_rule import _fused_recurrent_kernel

    if type(_fused_recurrent_kernel.fn).__name__ != "InterpretedFunction":
        pytest.skip("kernels/ compiled for a device (or imported before TRITON_INTERPRET)")

    _, _, ours, cfg, _ = pair
    ids = torch.randint(0, cfg.vocab_size, (13,), generator=torch.Generator().manual_seed(3))
    runs = []
    for triton_path in (False, True):
        monkeypatch.setattr(gdn, "use_kernels", lambda x, t=triton_path: t)
        drv = OneRequest(ours, cfg, 24)
        runs.append([drv.forward(ids[:10].tolist())[-1]]
                    + [drv.forward([int(t)])[0] for t in ids[10:]])
    for ref, got in zip(*runs):
        assert (got - ref).abs().max().item() < 1e-4


def _stack(sd: dict, pre: str, kind: str, cfg) -> torch.Tensor:
    # per-expert [rows, cols] tensors -> [E, rows, cols]
    return torch.stack([sd[f"{pre}{e}.{kind}.weight"] for e in range(cfg.num_experts)])


def test_fused_experts_and_multimodal_names_load(pair, tmp_path):
    """Qwen3.5-MoE's fused 3-D experts and the VL wrapper's names give the same model."""
    family, hf, ours, cfg, path = pair
    if family != "qwen3_5_moe":
        pytest.skip("fused experts are Qwen3.5-MoE's layout")
    from safetensors.torch import load_file, save_file
    sd = load_file(str(path / "model.safetensors"))
    out = {}
    for name, w in sd.items():
        if ".experts." in name and ".experts.0." not in name:
            continue
        if ".experts.0." in name:
            pre = name.split(".experts.")[0] + ".experts."
            if name.endswith("gate_proj.weight"):
                out[pre + "gate_up_proj"] = torch.cat(
                    [_stack(sd, pre, "gate_proj", cfg), _stack(sd, pre, "up_proj", cfg)], 1)
            elif name.endswith("down_proj.weight"):
                out[pre + "down_proj"] = _stack(sd, pre, "down_proj", cfg)
            continue
        out[name.replace("model.", "model.language_model.", 1)] = w
    out["model.visual.blocks.0.attn.qkv.weight"] = torch.zeros(4, 4)
    out["mtp.fc.weight"] = torch.zeros(4, 4)
    save_file(out, str(tmp_path / "model.safetensors"))
    config = json.loads((path / "config.json").read_text())
    config = {"architectures": ["Qwen3_5MoeForConditionalGeneration"],
              "model_type": "qwen3_5_moe", "text_config": config}
    (tmp_path / "config.json").write_text(json.dumps(config))
    twin, twin_cfg, _ = load_model(str(tmp_path))
    assert twin_cfg.architectures == ("Qwen3_5MoeForConditionalGeneration",)
    ref, got = dict(ours.named_parameters()), dict(twin.named_parameters())
    assert ref.keys() == got.keys()
    for k in ref:
        assert torch.equal(ref[k], got[k]), k
