"""The hybrid layers' kernel paths (engine/layers/gdn.py, engine/models/qwen3_next.py
Qwen3NextAttention) equal their torch paths, in fp32 on CUDA, or on CPU under the Triton
interpreter: the
gated attention with q and the output gate as strided views of q_proj's output (the gate
applied in the attention kernel's store), the GDN layer's decode (one-launch conv
update, gates and zero fill in the recurrent kernel, the Triton gated RMSNorm), its
mixed step (a chunked-kernel prefill row, then the recurrent kernel's decode rows into
the same output) and the
sparse MoE block's decode (one [E + 1, H] router GEMV for the router and the shared
expert's gate; the gated shared expert added in the routed w2 launch's epilogue).
Mirrors vLLM 0.33 tests/models/language/generation/test_hybrid.py's layer-level intent
(kernels vs reference on the same weights) at the layer level.
"""

from __future__ import annotations

import pytest
import torch
from test_kernels_common import DEVICE, gpu  # first: the Triton interpreter on CPU

import libvllm.engine.layers.attention as attention
import libvllm.engine.layers.gdn as gdn
import libvllm.kernels.fused_moe_gemv as moe_gemv
from libvllm.engine.layers.attention import AttentionMetadata
from libvllm.engine.layers.fused_moe import FusedMoE
from libvllm.engine.models.config import ModelArchConfig
from libvllm.engine.models.qwen3_next import Qwen3NextAttention, Qwen3NextSparseMoeBlock

BS = 4  # KV cache block size


def _cfg() -> ModelArchConfig:
    return ModelArchConfig(
        "qwen3_next", "t", 64, 32, 0, 1, 4, 2, 16, 1e-6, 1e4, 256, False,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                         "partial_rotary_factor": 0.5})


def _attn_md(q_lens: list[int], ctx: list[int]) -> AttentionMetadata:
    """Requests at contexts `ctx` scheduling q_lens tokens; block table row i: blocks
    8i.. (as many as 32 tokens take)."""
    qsl = [0]
    for n in q_lens:
        qsl.append(qsl[-1] + n)
    seq_lens = [c + n for c, n in zip(ctx, q_lens)]
    bt = torch.arange(len(q_lens) * 8, dtype=torch.int32, device=DEVICE).view(len(q_lens), 8)
    slots = [int(bt[i, p // BS]) * BS + p % BS for i, (c, s) in enumerate(zip(ctx, seq_lens))
             for p in range(c, s)]
    return AttentionMetadata(
        qsl[-1], torch.tensor(slots, device=DEVICE), qsl, seq_lens, bt,
        torch.tensor(qsl, dtype=torch.int32, device=DEVICE),
        torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE), max(q_lens), max(seq_lens))


def test_gated_attention_kernel_path_equals_torch(monkeypatch) -> None:
    torch.manual_seed(0)
    layer = Qwen3NextAttention(_cfg(), 0).to(DEVICE)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, 0.3)
    kv = {}
    outs = {}
    for kernels in (False, True):
        monkeypatch.setattr(attention, "use_kernels", lambda q, on=kernels: on)
        kv[kernels] = layer.attn.kv_cache = torch.zeros(2, 16, BS, 2, 16, device=DEVICE)
        steps = []
        torch.manual_seed(1)
        for q_lens, ctx in (([3, 5], [0, 0]), ([1, 1], [3, 5]), ([1, 1], [4, 6])):
            md = _attn_md(q_lens, ctx)
            x = torch.randn(md.num_actual_tokens, 32).to(DEVICE)
            pos = torch.tensor([c + j for c, n in zip(ctx, q_lens) for j in range(n)],
                               device=DEVICE)
            steps.append(layer(pos, x, md))  # prefill kernel, then the decode kernel
        outs[kernels] = torch.cat(steps)
    torch.testing.assert_close(outs[True], outs[False], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(kv[True], kv[False], atol=1e-5, rtol=1e-5)


def _gdn_md(rows: int, n: int, init: list[bool]) -> gdn.GDNMetadata:
    """n one-token requests on slots 1..n, padded to `rows` rows on the null slot 0."""
    qsl = list(range(rows + 1))
    slots = list(range(1, n + 1)) + [0] * (rows - n)
    init = init + [False] * (rows - n)
    return gdn.GDNMetadata(qsl[:n + 1], slots[:n], init[:n], 1,
                           torch.tensor(qsl, dtype=torch.int32, device=DEVICE),
                           torch.tensor(slots, device=DEVICE), torch.tensor(init, device=DEVICE))


def test_gdn_decode_kernel_path_equals_torch(monkeypatch) -> None:
    """Decode steps (padding rows on the null slot, as a decode CUDA graph) through the
    kernels equal the torch path: outputs of the requests' rows and their states."""
    torch.manual_seed(2)
    layer = gdn.GatedDeltaNetAttention(32, 2, 4, 16, 8, 4, 1e-6).to(DEVICE)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            p.uniform_(-1.0, 0.5) if name in ("A_log", "dt_bias") else p.normal_(0, 0.3)
    conv0 = torch.randn(4, 3, layer.conv_dim).to(DEVICE)
    ssm0 = torch.randn(4, 4, 8, 16).to(DEVICE)
    outs, states = {}, {}
    for kernels in (False, True):
        monkeypatch.setattr(gdn, "use_kernels", lambda x, on=kernels: on)
        layer.conv_state, layer.ssm_state = _pooled(conv0, ssm0)
        torch.manual_seed(3)
        steps = []
        for init in ([True, False], [True, True]):
            x = torch.randn(3, 32).to(DEVICE)  # two requests (+ a padding row on the kernels)
            rows = 3 if kernels else 2  # the torch path takes no padding rows
            steps.append(layer(x[:rows], _md(_gdn_md(rows, 2, init)))[:2])
        outs[kernels] = torch.cat(steps)
        states[kernels] = (layer.conv_state[1:3], layer.ssm_state[1:3])
    torch.testing.assert_close(outs[True], outs[False], atol=1e-5, rtol=1e-5)
    for a, b in zip(states[True], states[False]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def _md(g: gdn.GDNMetadata) -> AttentionMetadata:
    md = _attn_md([1] * len(g.state_indices), [0] * len(g.state_indices))
    md.gdn = [g]  # one KV cache group of GDN layers (the layer's state_group 0)
    return md


def _pooled(conv0: torch.Tensor, ssm0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Copies of the states as views of a block pool (engine/worker/mamba_utils.py): one
    padded page a slot, conv then SSM state, so the slot stride exceeds a state's size."""
    from libvllm.engine.core.kv_cache_interface import MambaSpec
    from libvllm.engine.worker.mamba_utils import state_views

    shapes = (tuple(conv0.shape[1:]), tuple(ssm0.shape[1:]))
    raw = MambaSpec(shapes, (conv0.dtype, ssm0.dtype)).page_size_bytes
    spec = MambaSpec(shapes, (conv0.dtype, ssm0.dtype), page_size_padded=raw + 256)
    buf = torch.zeros(conv0.shape[0] * spec.page_size_bytes, dtype=torch.int8,
                      device=conv0.device)
    conv, ssm = state_views(buf, spec, conv0.shape[0])
    conv.copy_(conv0)
    ssm.copy_(ssm0)
    return conv, ssm


def test_gdn_mixed_chunked_prefill_and_decode_equals_torch(monkeypatch) -> None:
    """A step mixing a prefill row of more than one chunk (continuing from its state), a
    one-token decode row and a padding row on the null slot: the chunked kernel runs the
    prefill row, then the recurrent kernel fills the decode row into the same output
    (`out=`); outputs and both rows' conv and ssm states equal the torch path's."""
    monkeypatch.setattr(gdn, "GDN_PREFILL_BACKEND", "auto")
    torch.manual_seed(5)
    layer = gdn.GatedDeltaNetAttention(32, 2, 2, 16, 16, 4, 1e-6).to(DEVICE)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            p.uniform_(-1.0, 0.5) if name in ("A_log", "dt_bias") else p.normal_(0, 0.3)
    conv0 = torch.randn(3, 3, layer.conv_dim).to(DEVICE)  # [slots, K-1, conv_dim]
    ssm0 = torch.randn(3, 2, 16, 16).to(DEVICE)  # [slots, Hv, dv, dk]
    x = torch.randn(72, 32).to(DEVICE)  # 70 prefill tokens, 1 decode token, 1 padding row
    launches = []  # (kernel, whether it wrote into a given `out`)
    chunk, fused = gdn.chunk_sigmoid_gating_delta_rule, gdn.fused_sigmoid_gating_delta_rule
    monkeypatch.setattr(gdn, "chunk_sigmoid_gating_delta_rule", lambda *a, **k: launches.append(
        ("chunk", len(a) > 12 or "out" in k)) or chunk(*a, **k))
    monkeypatch.setattr(gdn, "fused_sigmoid_gating_delta_rule", lambda *a, **k: launches.append(
        ("fused", len(a) > 11 or "out" in k)) or fused(*a, **k))
    outs, states = {}, {}
    for kernels in (False, True):
        monkeypatch.setattr(gdn, "use_kernels", lambda x, on=kernels: on)
        layer.conv_state, layer.ssm_state = _pooled(conv0, ssm0)
        rows = 3 if kernels else 2  # the torch path takes no padding rows
        qsl, slots, init = [0, 70, 71, 72], [1, 2, 0], [True, True, False]
        g = gdn.GDNMetadata(qsl[:3], slots[:2], init[:2], 70,
                            torch.tensor(qsl[:rows + 1], dtype=torch.int32, device=DEVICE),
                            torch.tensor(slots[:rows], device=DEVICE),
                            torch.tensor(init[:rows], device=DEVICE))
        assert g.chunked_prefill
        with torch.no_grad():  # the layer reads md.gdn alone
            outs[kernels] = layer(x[:qsl[rows]], _md(g))[:71]
        states[kernels] = (layer.conv_state[1:3], layer.ssm_state[1:3])
    assert launches == [("chunk", False), ("fused", True)]
    torch.testing.assert_close(outs[True], outs[False], atol=1e-5, rtol=1e-5)
    for a, b in zip(states[True], states[False]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_in_proj_loads_shards_and_grouped_parts() -> None:
    """One in_proj [q | k | v | z | b | a]: Qwen3.5's four shards and Qwen3-Next's grouped
    in_proj_qkvz / in_proj_ba (rows interleaved per key head) give the same weight."""
    from libvllm.engine.errors import ModelLoadError

    hk, hv, dk, dv, hidden = 2, 4, 2, 3, 8
    r = hv // hk
    layer = gdn.GatedDeltaNetAttention(hidden, hk, hv, dk, dv, 4, 1e-6)
    param = layer.in_proj.weight
    sizes = {"qkv": 2 * hk * dk + hv * dv, "z": hv * dv, "b": hv, "a": hv}
    parts = {name: torch.randn(n, hidden) for name, n in sizes.items()}
    for name, w in parts.items():
        param.weight_loader(param, w, "", name)
    want = torch.cat(list(parts.values()))
    torch.testing.assert_close(param.data, want)
    qkv, z, b, a = parts.values()
    q, k, v = qkv.split([hk * dk, hk * dk, hv * dv])
    qkvz = torch.cat([torch.cat([q[g * dk:(g + 1) * dk], k[g * dk:(g + 1) * dk],
                                 v[g * r * dv:(g + 1) * r * dv], z[g * r * dv:(g + 1) * r * dv]])
                      for g in range(hk)])
    ba = torch.cat([torch.cat([b[g * r:(g + 1) * r], a[g * r:(g + 1) * r]]) for g in range(hk)])
    param.data.zero_()
    param.weight_loader(param, qkvz, "", "qkvz")
    param.weight_loader(param, ba, "", "ba")
    torch.testing.assert_close(param.data, want)
    with pytest.raises(ModelLoadError, match="has shape"):
        param.weight_loader(param, torch.zeros(hv, hidden), "", "ba")


def _moe_cfg(shared: int) -> ModelArchConfig:
    cfg = _cfg()
    cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size = 16, 2, 8
    cfg.shared_expert_intermediate_size = shared
    return cfg


@pytest.mark.parametrize("m", [1, 2])  # M * top_k * 4 <= E: the routed GEMV path
@pytest.mark.parametrize("shared", [24, 0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16] if DEVICE == "cuda"
                         else [torch.float32])
def test_moe_block_decode_kernel_path_equals_torch(monkeypatch, m, shared, dtype) -> None:
    """Qwen3NextSparseMoeBlock at decode: the folded path (the shared expert first, its
    sigmoid gate and add in the routed w2 launch, the gate logit a column of the merged
    router output) equals the torch composition on the same weights."""
    torch.manual_seed(4)
    block = Qwen3NextSparseMoeBlock(_moe_cfg(shared), True).to(DEVICE, dtype)
    # [E + 1, H] with a shared expert (its gate's row), [E, H] without
    assert tuple(block.gate.weight.shape) == (17 if shared else 16, 32)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.3)
    x = torch.randn(m, 32).to(DEVICE, dtype)
    folded = []  # per routed w2 launch: whether it added the shared expert
    w2_routed = moe_gemv.fused_moe_gemv_w2_routed
    monkeypatch.setattr(moe_gemv, "fused_moe_gemv_w2_routed", lambda *a, **k: folded.append(
        k.get("shared_out") is not None) or w2_routed(*a, **k))
    real = FusedMoE.folds_shared_gate  # on CUDA the kernel path is the layer's own choice
    outs = {}
    for kernels in (False, True):
        monkeypatch.setattr(FusedMoE, "folds_shared_gate", real if kernels and DEVICE == "cuda"
                            else lambda self, x, on=kernels: on)
        folded.clear()
        with torch.no_grad():
            outs[kernels] = block(x)
    # no shared expert: the routed pair alone on CUDA, the host path on CPU
    assert folded == ([True] if shared else [False] if DEVICE == "cuda" else [])
    tol = 1e-5 if dtype == torch.float32 else 1.6e-2
    torch.testing.assert_close(outs[True], outs[False], atol=tol, rtol=tol)


def test_moe_block_gate_loads_both_checkpoint_gates() -> None:
    """`mlp.gate` [E, H] and `mlp.shared_expert_gate` [1, H] fill the merged router's rows."""
    from libvllm.engine.errors import ModelLoadError
    from libvllm.engine.models.qwen3_next import MOE_GATE_PARAMS_MAPPING
    from libvllm.engine.models.utils import _route

    block = Qwen3NextSparseMoeBlock(_moe_cfg(24), True)
    param = block.gate.weight
    gate, shared_gate = torch.randn(16, 32), torch.randn(1, 32)
    for ckpt, w in (("model.layers.3.mlp.shared_expert_gate.weight", shared_gate),
                    ("model.layers.3.mlp.gate.weight", gate)):
        target, args, _ = _route(ckpt, MOE_GATE_PARAMS_MAPPING)
        assert target == "model.layers.3.mlp.gate.weight"
        param.weight_loader(param, w, *args)
    torch.testing.assert_close(param.data, torch.cat([gate, shared_gate]))
    with pytest.raises(ModelLoadError, match="has shape"):
        param.weight_loader(param, gate, "", "shared_expert_gate")
    with pytest.raises(ModelLoadError, match="unknown shard"):
        param.weight_loader(param, gate, "", "up")


@gpu
def test_moe_block_folded_decode_under_a_cuda_graph(monkeypatch) -> None:
    """Qwen3.5-35B-A3B's block (E 256, top-8, H 2048, I 512, shared I 512) in bf16,
    replayed from a CUDA graph on new inputs (the routed w2 reads the merged router's
    logits before its PDL wait, the shared output and gate in its epilogue): the eager
    torch composition every time."""
    import dataclasses

    cfg = dataclasses.replace(_cfg(), hidden_size=2048, num_experts=256, num_experts_per_tok=8,
                              moe_intermediate_size=512, shared_expert_intermediate_size=512)
    block = Qwen3NextSparseMoeBlock(cfg, True).to(DEVICE, torch.bfloat16)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 2048**-0.5)
        x = torch.randn(1, 2048, device=DEVICE).bfloat16()
        assert block.experts.folds_shared_gate(x)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            block(x)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = block(x)
        for seed in range(4):
            x.copy_(torch.randn(1, 2048, generator=torch.Generator(DEVICE).manual_seed(seed),
                                device=DEVICE).bfloat16())
            graph.replay()
            with monkeypatch.context() as mp:
                mp.setattr(FusedMoE, "folds_shared_gate", lambda self, x: False)
                want = block(x)
            torch.testing.assert_close(out, want, atol=1.6e-2, rtol=1.6e-2)
