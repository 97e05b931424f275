"""Qwen3.5 / Qwen3.6 dense (hybrid Gated DeltaNet + gated attention), as
vllm/model_executor/models/qwen3_5.py.

The Qwen3-Next decoder (engine/models/qwen3_next.py) with a dense SwiGLU FFN on every
layer and the flat GDN in-projections (in_proj_qkv / in_proj_z / in_proj_b / in_proj_a,
loaded as shards of the one in_proj, as vLLM's stacked mapping). The
multimodal checkpoints (Qwen3_5ForConditionalGeneration) load text-only: the
`model.language_model.` prefix becomes `model.`, `model.visual.*` and `mtp.*` are skipped
(vLLM's hf_to_vllm_mapper for the text-only class). Text-only positions make the
interleaved M-RoPE of the config plain 1-D RoPE, so mrope fields are ignored.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from libvllm.engine.models.config import ModelArchConfig
from libvllm.engine.models.llama import LlamaMLP
from libvllm.engine.models.qwen3_next import Qwen3NextDecoderLayer, Qwen3NextForCausalLM

_LM_PREFIX = "model.language_model."


class Qwen3_5DecoderLayer(Qwen3NextDecoderLayer):
    def _make_mlp(self, cfg: ModelArchConfig, layer_idx: int) -> nn.Module:
        return LlamaMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act)


class Qwen3_5ForCausalLM(Qwen3NextForCausalLM):
    layer_cls = Qwen3_5DecoderLayer
    skip_prefixes = ("mtp.", "model.visual.", "visual.")

    def _weights(self, weights: Iterable[tuple[str, torch.Tensor]]
                 ) -> Iterable[tuple[str, torch.Tensor]]:
        for name, w in super()._weights(weights):
            if name.startswith(_LM_PREFIX):
                name = "model." + name[len(_LM_PREFIX):]
            yield name, w


class Qwen3_5ForConditionalGeneration(Qwen3_5ForCausalLM):
    """The VL checkpoint's text-only path (the vision tower is not loaded)."""
