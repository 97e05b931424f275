"""GGUF weights kept quantized on the GPU (engine/model_loader/gguf_quant.py).

A tiny Llama GGUF file with mixed quant types (q/k Q8_0 and v Q4_0: an unmerged shard
pair; Q5_1, Q4_1, Q5_0 elsewhere; Q8_0 LM head) is loaded twice: densely (the CPU path)
and with its linear weights swapped for raw GGUF blocks. On CPU: every swapped layer's
blocks dequantize (engine/gguf/dequant.py, the llama.cpp oracle) to exactly the dense
weight, Llama Q/K un-permutation included. On CUDA (gpu): the engine runs the GGUF
GEMV/GEMM kernels, its prompt logits match the dense bf16 path, and greedy decoding with
CUDA graphs equals enforce_eager. Mirrors vLLM 0.33 tests/models/quantization/test_gguf.py
(GGUF model vs its dense twin).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():  # as tests/test_kernels_common.py: kernels/ defined for
    os.environ.setdefault("TRITON_INTERPRET", "1")  # the interpreter before any import

from libvllm.engine.config import EngineConfig
from libvllm.engine.gguf.constants import GGML_TYPE_TRAITS, GGMLType
from libvllm.engine.gguf.dequant import dequantize
from libvllm.engine.layers.activation import SiluAndMul
from libvllm.engine.layers.linear import GGUFWeight
from libvllm.engine.llm_engine import LLMEngine
from libvllm.engine.model_loader import load_gguf_model, load_model
from libvllm.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.usefixtures("in_process_core")


gguf = pytest.importorskip("gguf")
pytest.importorskip("triton")
Q = gguf.GGMLQuantizationType
H, FF, LAYERS, HEADS, KV_HEADS, VOCAB = 128, 256, 2, 4, 2, 320
TYPES = {"attn_q": Q.Q8_0, "attn_k": Q.Q8_0, "attn_v": Q.Q4_0, "attn_output": Q.Q5_1,
         "ffn_gate": Q.Q4_1, "ffn_up": Q.Q4_1, "ffn_down": Q.Q5_0}


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf")
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_context_length(512)
    w.add_embedding_length(H)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FF)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    hd = H // HEADS

    def add(name: str, shape: tuple[int, ...], qtype=None) -> None:
        a = rng.normal(0, 0.2, shape).astype(np.float32) if len(shape) > 1 else \
            rng.uniform(0.5, 1.5, shape).astype(np.float32)
        if qtype is None:
            w.add_tensor(name, a)
        else:
            w.add_tensor(name, gguf.quants.quantize(a, qtype), raw_dtype=qtype)

    add("token_embd.weight", (VOCAB, H), Q.Q8_0)
    add("output_norm.weight", (H,))
    add("output.weight", (VOCAB, H), Q.Q8_0)
    shapes = {"attn_q": (H, H), "attn_k": (KV_HEADS * hd, H), "attn_v": (KV_HEADS * hd, H),
              "attn_output": (H, H), "ffn_gate": (FF, H), "ffn_up": (FF, H),
              "ffn_down": (H, FF)}
    for i in range(LAYERS):
        add(f"blk.{i}.attn_norm.weight", (H,))
        add(f"blk.{i}.ffn_norm.weight", (H,))
        for part, shape in shapes.items():
            add(f"blk.{i}.{part}.weight", shape, TYPES[part])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_swapped_blocks_dequantize_to_the_dense_weights(gguf_path):
    dense_model, _, reader = load_model(gguf_path)
    reader.close()
    dense = {n: p.detach().clone() for n, p in dense_model.named_parameters()}
    model, _, reader = load_gguf_model(gguf_path, keep_quantized=True)
    reader.close()
    qkv = model.model.layers[0].self_attn.qkv_proj.gguf_weight
    assert qkv.qtypes == [Q.Q8_0, Q.Q4_0]  # q + k merged (same type), v apart
    swapped = []
    for name, module in model.named_modules():
        gw = getattr(module, "gguf_weight", None)
        if not isinstance(gw, GGUFWeight):
            continue
        assert module.weight is None and f"{name}.weight" not in dict(model.named_parameters())
        rows = []
        for i, qtype in enumerate(gw.qtypes):
            raw = getattr(gw, f"qweight{i}")  # [N, row_bytes]
            block, type_size = GGML_TYPE_TRAITS[GGMLType(qtype)]
            k = raw.shape[1] // type_size * block
            rows.append(dequantize(raw.reshape(-1), qtype, raw.shape[0] * k).view(-1, k))
        assert torch.equal(torch.cat(rows), dense[f"{name}.weight"]), name
        swapped.append(name)
    assert len(swapped) == 4 * LAYERS + 1  # qkv, o, gate_up, down per layer + the LM head
    assert set(dense) - {n for n, _ in model.named_parameters()} == {
        f"{n}.weight" for n in swapped}  # embeddings and norms stay dense


def greedy(path: str, eager: bool) -> tuple[list[int], LLMEngine]:
    engine = LLMEngine.from_config(EngineConfig(path, device="cuda", skip_tokenizer_init=True,
                                                enforce_eager=eager, max_num_seqs=4,
                                                kv_cache_memory_bytes=32 << 20))
    for i in range(3):
        engine.add_request(str(i), [(5 * i + j) % VOCAB for j in range(9 + 4 * i)],
                           SamplingParams(temperature=0.0, max_tokens=8 + 2 * i, ignore_eos=True))
    out = {}
    while engine.has_unfinished_requests():
        out.update({o.request_id: o.outputs[0].token_ids for o in engine.step() if o.finished})
    return [out[str(i)] for i in range(3)], engine


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_runs_the_gguf_kernels_like_the_dense_path(gguf_path):
    graphs, engine = greedy(gguf_path, eager=False)
    model = engine.model_runner.model
    qkv = model.model.layers[0].self_attn.qkv_proj
    assert qkv.weight is None and qkv.gguf_weight.qweight0.is_cuda
    assert graphs == greedy(gguf_path, eager=True)[0]
    dense, _, reader = load_model(gguf_path)
    reader.close()
    dense = dense.to("cuda", torch.bfloat16)
    quantized = dict(model.named_modules())
    with torch.inference_mode():
        for name, want in dense.named_modules():
            got = quantized[name]
            if getattr(got, "gguf_weight", None) is None or name == "lm_head":
                continue
            for m in (1, 8, 40):  # the GEMV, fused-GEMM and dequantize + cuBLAS paths
                x = torch.randn(m, got.input_size, device="cuda", dtype=torch.bfloat16)
                ref = want(x).float()
                err = ((got(x).float() - ref).abs().max() / ref.abs().max()).item()
                assert err < 2e-2, (name, m, err)
        h = torch.randn(3, H, device="cuda", dtype=torch.bfloat16)
        ref = dense.compute_logits(h)
        assert ((model.compute_logits(h) - ref).abs().max() / ref.abs().max()).item() < 2e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_start_up_compiles_the_gguf_kernels_of_every_row_count(gguf_path, triton_compiles):
    """compute_logits runs outside the CUDA graphs, and a GGUF layer picks its Triton
    variant by row count (GEMV block rows, the fused GEMM to 16 rows): a row count first
    seen while serving waited for Triton's JIT (a compile inside the timed
    offline run). Start-up compiles every GGUF layer's variants
    (engine/model_loader/gguf_quant.py precompile_gguf_kernels); past 65 rows, one path."""
    engine = LLMEngine.from_config(EngineConfig(gguf_path, device="cuda", max_num_seqs=80,
                                                skip_tokenizer_init=True,
                                                kv_cache_memory_bytes=32 << 20))
    triton_compiles.clear()
    with torch.inference_mode():
        for rows in range(1, 81):
            engine.model_runner.model.compute_logits(
                torch.randn(rows, H, device="cuda", dtype=torch.bfloat16))
        mlp = engine.model_runner.model.model.layers[0].mlp
        for rows in (3, 12, 16, 40, 70):  # Q5_0 down: SiLU-and-mul, then the GEMM paths
            mlp.down_proj.forward_act_and_mul(torch.randn(rows, 2 * FF, device="cuda",
                                                          dtype=torch.bfloat16), SiluAndMul())
        for rows in (1, 5, 8):  # an int8-dot type (Q4_1) with SiLU-and-mul in its q8_1 input
            mlp.gate_up_proj.gguf_weight(torch.randn(rows, 2 * H, device="cuda",
                                                     dtype=torch.bfloat16), True)
    assert triton_compiles == []
