"""GGUF weights that stay quantized on the GPU: linear layers and an untied LM head.

Mirrors vllm/model_executor/layers/quantization/gguf.py (GGUFLinearMethod: the raw blocks
of each shard of a fused qkv / gate_up projection kept with their own GGML type, the
matmul through the GGUF kernels) and the shard handling of vllm/model_executor/
model_loader/gguf_loader.py. Before the dense load, each linear layer whose GGUF
tensors all have a Triton kernel (kernels/gguf_tiles.py) and the layer's shapes gets a
GGUFWeight holding the raw rows (Llama Q/K rows un-permuted as the dense path does; rows
are independent blocks, so this is a row permutation), adjacent shards of one type merged
into one buffer; its dense weight is dropped (never touched, so never allocated) and
those tensors are never dequantized. A FusedMoE layer whose ffn_gate_exps / ffn_up_exps /
ffn_down_exps all have a kernel gets a GGUFExperts holding them as [E, rows, row_bytes]
(gate and up merged when of one type; engine/layers/fused_moe/gguf_experts.py, vLLM's
GGUFMoEMethod) and drops w13/w2. Embeddings, norms and tensors of other types load dense.
Under tensor parallelism each rank keeps its share of the blocks (gguf_shard.py); a
tensor whose input dim cannot be split on block boundaries loads dense, then sliced.
Once on the GPU, precompile_gguf_kernels compiles the layers' Triton variants side by side.
"""

from __future__ import annotations

import torch
from torch import nn

from libvllm.engine.errors import ModelLoadError
from libvllm.engine.gguf.constants import GGML_TYPE_TRAITS, GGMLType
from libvllm.engine.gguf.reader import GGUFReader
from libvllm.engine.layers.fused_moe import FusedMoE
from libvllm.engine.layers.fused_moe.gguf_experts import GGUFExperts
from libvllm.engine.layers.linear import GGUFWeight, ReplicatedLinear, RowParallelLinear
from libvllm.engine.layers.vocab_parallel_embedding import ParallelLMHead
from libvllm.engine.model_loader.gguf_loader import _hf_name, _reverse_permute
from libvllm.engine.model_loader.gguf_shard import shard_cols, shard_linear, shard_rows
from libvllm.engine.models.config import ModelArchConfig

# fused module -> checkpoint projections, in output order (models/utils.py's mapping)
_SHARDS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def _raw_rows(reader: GGUFReader, gguf_name: str, hf_name: str, cfg: ModelArchConfig
              ) -> torch.Tensor:
    """[N, row_bytes] uint8 copy of a quantized 2-D tensor's blocks."""
    rows = reader.tensors[gguf_name].shape[0]
    raw = torch.from_numpy(reader.tensor_bytes(gguf_name).copy()).view(rows, -1)
    if cfg.architecture == "llama" and hf_name.endswith(".q_proj.weight"):
        raw = _reverse_permute(raw, cfg.num_attention_heads)
    elif cfg.architecture == "llama" and hf_name.endswith(".k_proj.weight"):
        raw = _reverse_permute(raw, cfg.num_key_value_heads)
    return raw.contiguous()


def _checkpoint_names(name: str, module: nn.Module, cfg: ModelArchConfig) -> list[str] | None:
    if isinstance(module, ParallelLMHead) and not cfg.tie_word_embeddings:
        return [f"{name}.weight"]
    if not isinstance(module, ReplicatedLinear):
        return None
    base, _, leaf = name.rpartition(".")
    parts = _SHARDS.get(leaf)
    return [f"{base}.{p}.weight" for p in parts] if parts else [f"{name}.weight"]


def keep_gguf_quantized(model: nn.Module, reader: GGUFReader, cfg: ModelArchConfig
                        ) -> set[str]:
    """Swap dense weights for GGUF blocks where kernels exist; returns the GGUF tensor
    names now held quantized (the dense load skips them)."""
    from libvllm.kernels.gguf_tiles import TILE_TYPES  # lazy: triton, CUDA path only

    by_hf = {hf: name for name in reader.tensors if (hf := _hf_name(name, cfg)) is not None}
    absorbed: set[str] = set()
    for name, module in list(model.named_modules()):
        if isinstance(module, FusedMoE):
            absorbed.update(_keep_experts_quantized(name, module, reader, by_hf, TILE_TYPES))
            continue
        hf_names = _checkpoint_names(name, module, cfg)
        gguf_names = [by_hf.get(h) for h in hf_names or ()]
        if not gguf_names or None in gguf_names or any(
                reader.tensors[g].ggml_type not in TILE_TYPES for g in gguf_names):
            continue
        k = reader.tensors[gguf_names[0]].shape[1]
        raws = shard_linear(module, [(_raw_rows(reader, g, h, cfg),
                                      int(reader.tensors[g].ggml_type))
                                     for g, h in zip(gguf_names, hf_names)], k)
        if raws is None:  # not on block boundaries: dense, sliced by the weight loader
            continue
        rows = sum(raw.shape[0] for raw, _ in raws)
        split_k = module.tp_size if isinstance(module, RowParallelLinear) else 1
        if any(reader.tensors[g].shape[1:] != (k,) for g in gguf_names) or \
                rows != module.weight.shape[0] or k != module.weight.shape[1] * split_k:
            raise ModelLoadError(f"{gguf_names}: shapes do not match {name} "
                                 f"{tuple(module.weight.shape)}")
        shards: list[tuple[torch.Tensor, int]] = []
        for raw, qtype in raws:
            if shards and shards[-1][1] == qtype:  # same type: one buffer, one kernel
                raw = torch.cat([shards.pop()[0], raw])
            shards.append((raw, qtype))
        module.gguf_weight = GGUFWeight(shards)
        module.weight = None
        absorbed.update(gguf_names)
    return absorbed


def _keep_experts_quantized(name: str, module: FusedMoE, reader: GGUFReader,
                            by_hf: dict[str, str], tile_types: dict) -> set[str]:
    """GGUFExperts for one FusedMoE when its three stacked tensors have kernels."""
    names = [by_hf.get(f"{name}.{p}.weight") for p in ("gate_proj", "up_proj", "down_proj")]
    if None in names or any(reader.tensors[g].ggml_type not in tile_types for g in names):
        return set()
    i, tp = module.intermediate_size, module.tp_size  # i: this rank's share
    want = [i * tp] * 2 + [module.w2_weight.shape[1]]
    raws = []
    for n, (g, rows) in enumerate(zip(names, want)):
        info = reader.tensors[g]
        if len(info.shape) != 3 or info.shape[:2] != (module.num_experts, rows):
            raise ModelLoadError(f"{g} has shape {info.shape}, want ({module.num_experts}, "
                                 f"{rows}, ...)")
        raw = torch.from_numpy(reader.tensor_bytes(g).copy()).view(info.shape[0], rows, -1)
        qtype = int(info.ggml_type)
        # tensor parallel: gate/up rows [E, I, .] and down's input blocks [E, H, I]
        raw = shard_rows(raw, module.tp_rank * i, i, dim=1) if n < 2 else \
            shard_cols(raw, qtype, info.shape[2], module.tp_rank, tp)
        if raw is None:  # down's K / tp is not whole blocks: dense
            return set()
        raws.append((raw, qtype))
    (gate, t1), (up, t2), w2 = raws
    w13 = [(torch.cat([gate, up], dim=1), t1)] if t1 == t2 else [(gate, t1), (up, t2)]
    module.gguf_experts = GGUFExperts(w13, w2)
    module.w13_weight = None
    module.w2_weight = None
    return set(names)


@torch.inference_mode()
def precompile_gguf_kernels(model: nn.Module) -> None:
    """Compile every Triton variant the model's GGUFWeights (its GGUF linear layers and LM
    head; GGUF MoE experts compile on first use) launch: GEMV block rows, the fused GEMMs'
    configs, with and without the fused SiLU-and-mul, for every token count up to one past
    the last row threshold of kernels/gguf_mmvq.py and kernels/gguf_gemm.py (beyond it
    dequantize + cuBLAS, one variant), on a thread pool (kernels/_common.py
    precompile_triton: no launch). One at a time inside the profile run and the graph
    capture, a Q4_K_M Llama-8B's 63 compiles took 135 s on the H200 (docs/BENCHMARKS.md). The
    activations take the dtype of the model's dense weights (embeddings, norms: one dtype,
    engine/worker/model_load.py). CUDA only."""
    from libvllm.kernels._common import precompile_triton  # lazy: triton, CUDA path only
    from libvllm.kernels.gguf_gemm import GEMV_MAX_M, KQUANT_MAX_M, MMQ_MAX_M
    from libvllm.kernels.gguf_mmvq import MMVQ_MAX_M

    rows = max(GEMV_MAX_M, MMQ_MAX_M, MMVQ_MAX_M, *KQUANT_MAX_M.values()) + 1
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
    if dtype is None:  # no dense weight, no activation dtype to compile for
        return
    seen = set()
    with precompile_triton():
        for gw in model.modules():
            if not isinstance(gw, GGUFWeight):
                continue
            block, size = GGML_TYPE_TRAITS[GGMLType(gw.qtypes[0])]
            k = gw.qweight0.shape[1] // size * block
            key = (tuple(gw.qtypes), tuple(gw.sizes), k)
            if key in seen:
                continue
            seen.add(key)
            for m in range(1, rows + 1):
                for silu_and_mul in (False, True):
                    x = torch.zeros(m, k * (1 + silu_and_mul), dtype=dtype,
                                    device=gw.qweight0.device)
                    gw(x, silu_and_mul)
    if seen:
        torch.cuda.empty_cache()  # the dequantized weights of the widest rows
