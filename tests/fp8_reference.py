"""Reference FP8 quantizer for the FP8 checkpoint tests: writes tiny checkpoints the way
Qwen's block-FP8 releases and llm-compressor's compressed-tensors FP8 ones are laid out,
and the fp32 twin whose weights are the dequantized FP8 ones (the oracle's).

Quantization (per vLLM 0.33 tests/quantization/test_fp8.py's reference and Qwen's
checkpoints): block FP8 scale_inv = absmax / 448 per bn x bk block, fp32; per channel
(compressed-tensors FP8_DYNAMIC) scale = row absmax / 448, [N, 1]; per tensor
scale = absmax / 448 with a static input_scale; compressed-tensors block (FP8_BLOCK) as
block FP8 with the scale named weight_scale. q = clamp(w / scale, +-448) as
float8_e4m3fn; dequantized = q * scale in fp32.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

FP8_MAX = 448.0
INPUT_SCALE = 0.05  # the per-tensor scheme's static activation scale, every layer
# the linear weights Qwen's FP8 checkpoints quantize; everything else stays as it is
QUANTIZED = re.compile(r"\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj|"
                       r"in_proj_qkv|in_proj_z|out_proj)\.weight$")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def quant(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (w / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def quant_block(w: torch.Tensor, bn: int, bk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] fp32 -> (q [N, K] fp8, scale_inv [ceil(N/bn), ceil(K/bk)] fp32)."""
    n, k = w.shape
    pad = torch.zeros(_cdiv(n, bn) * bn, _cdiv(k, bk) * bk)
    pad[:n, :k] = w
    blocks = pad.view(_cdiv(n, bn), bn, _cdiv(k, bk), bk)
    scale = (blocks.abs().amax(dim=(1, 3)) / FP8_MAX).clamp_min(1e-12)
    full = scale.repeat_interleave(bn, 0).repeat_interleave(bk, 1)[:n, :k]
    return quant(w, full), scale


def dequant_block(q: torch.Tensor, scale: torch.Tensor, bn: int, bk: int) -> torch.Tensor:
    n, k = q.shape
    return q.float() * scale.repeat_interleave(bn, 0).repeat_interleave(bk, 1)[:n, :k]


def quantize_state(state: dict, scheme: str, block=(128, 128)) -> tuple[dict, dict]:
    """(quantized checkpoint tensors, dequantized fp32 twin tensors) of a state dict."""
    out, twin = {}, {}
    for name, w in state.items():
        if not QUANTIZED.search(name):
            out[name] = twin[name] = w
            continue
        base = name[:-len("weight")]
        w = w.float()
        if scheme in ("fp8-block", "ct-block"):
            q, s = quant_block(w, *block)
            out[base + ("weight_scale_inv" if scheme == "fp8-block" else "weight_scale")] = s
            twin[name] = dequant_block(q, s, *block)
        elif scheme == "ct-channel":
            s = (w.abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp_min(1e-12)  # [N, 1]
            q = quant(w, s)
            out[base + "weight_scale"] = s
            twin[name] = q.float() * s
        else:  # ct-tensor, static activations
            s = (w.abs().amax() / FP8_MAX).reshape(1)
            q = quant(w, s)
            out[base + "weight_scale"] = s
            out[base + "input_scale"] = torch.tensor([INPUT_SCALE])
            twin[name] = q.float() * s
        out[name] = q
    return out, twin


def quantization_config(scheme: str, ignore: list[str], block=(128, 128)) -> dict:
    """config.json's quantization_config as Qwen / llm-compressor write it (the latter by
    the compressed-tensors package: skips without it)."""
    if scheme == "fp8-block":
        return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": list(block), "modules_to_not_convert": ignore}
    # compressed-tensors' own presets, as llm-compressor writes them
    ct = pytest.importorskip("compressed_tensors.quantization")
    preset = {"ct-channel": "FP8_DYNAMIC", "ct-tensor": "FP8", "ct-block": "FP8_BLOCK"}[scheme]
    group = ct.preset_name_to_scheme(preset, ["Linear"])
    if scheme == "ct-block":
        group.weights.block_structure = list(block)
        group.input_activations.group_size = block[1]
    return ct.QuantizationConfig(config_groups={"group_0": group}, ignore=ignore,
                                 quantization_status="compressed",
                                 format="float-quantized").model_dump()


def ignored_modules(state: dict) -> list[str]:
    """Every 2-D weight's module that is not quantized (lm_head, routers, GDN a/b)."""
    return sorted({n[:-len(".weight")] for n, w in state.items()
                   if n.endswith(".weight") and w.dim() == 2 and not QUANTIZED.search(n)
                   and "embed_tokens" not in n})


def write_fp8_pair(hf_model, root: Path, scheme: str, block=(128, 128)) -> tuple[Path, Path]:
    """(FP8 checkpoint dir, dequantized fp32 twin dir) of a transformers model."""
    src = root / "src"
    hf_model.save_pretrained(src)
    state = load_file(src / "model.safetensors")
    qstate, twin = quantize_state(state, scheme, block)
    config = json.loads((src / "config.json").read_text())
    dirs = []
    for sub, tensors, qcfg in (
            ("fp8", qstate, quantization_config(scheme, ignored_modules(state), block)),
            ("twin", twin, None)):
        d = root / sub
        d.mkdir()
        save_file({k: v.contiguous() for k, v in tensors.items()}, d / "model.safetensors",
                  metadata={"format": "pt"})
        cfg = dict(config, quantization_config=qcfg) if qcfg else config
        (d / "config.json").write_text(json.dumps(cfg))
        if (src / "generation_config.json").exists():
            shutil.copy(src / "generation_config.json", d)
        dirs.append(d)
    return dirs[0], dirs[1]


def edit_checkpoint(d: Path, fn) -> None:
    """Rewrite model.safetensors through fn(state) -> state."""
    state = load_file(d / "model.safetensors")
    save_file(fn(dict(state)), d / "model.safetensors", metadata={"format": "pt"})


def edit_quant_config(d: Path, **changes) -> None:
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"] = {**cfg["quantization_config"], **changes}
    (d / "config.json").write_text(json.dumps(cfg))
