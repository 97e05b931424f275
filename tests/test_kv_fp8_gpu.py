"""The fp8 KV cache on CUDA end to end (marked gpu; skipped without a CUDA device): the
Triton path (reshape_and_cache / rotary_cache / gemv_rope_cache writes, decode and
unified attention reads) against the engine's torch path on the same device, CUDA graphs
against eager, calculate_kv_scales inside captured graphs, the block count.

Oracle: engine/layers/attention.py's torch path (reshape_and_cache + paged_attention_ref,
whose fp8 rule tests/test_kv_fp8.py checks against transformers); the eager engine for the
graphs (vLLM 0.33 tests/v1/cudagraph: graph and eager outputs equal); vLLM's page size
arithmetic for the block count (twice the blocks of bf16 at one byte an element).
"""

from __future__ import annotations

import math

import pytest
import torch

import libvllm.engine.layers.attention as attention
from libvllm.engine.layers.attention import Attention, AttentionMetadata
from libvllm.engine.layers.kv_scales import configure_kv_cache
from libvllm.engine.model_loader import load_model
from libvllm.engine.worker.model_runner import ModelRunner
from tests.test_gpu_model_runner import (
    PROMPTS,
    check_logprobs_close,
    greedy,
    our_prompt_logits,
)
from tests.test_models_parity import make_hf_model

pytest.importorskip("transformers")
pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("in_process_core"),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

FP8 = dict(kv_cache_memory_bytes=64 << 20, kv_cache_dtype="fp8")


@pytest.fixture(scope="module", params=["llama", "qwen3"])  # qwen3: the q/k-norm rope cache
def hf_dir(request, tmp_path_factory):
    model = make_hf_model(request.param, max_position_embeddings=512)
    d = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(d)
    return str(d)


def _layers(engine) -> list[Attention]:
    return [m for m in engine.model_runner.model.modules() if isinstance(m, Attention)]


def _fp8_prompt_logits(path: str, kernels: bool = True) -> torch.Tensor:
    """[len(ids), vocab] fp32 logits of one bf16 prefill of PROMPTS[0] over fp8 caches
    (scale 1.0), through the kernels or the torch path on the GPU."""
    model, cfg, _ = load_model(path)
    model = model.to("cuda", torch.bfloat16)
    ids = PROMPTS[0]
    n, bs = len(ids), 16
    nblocks = math.ceil(n / bs)
    dtype = configure_kv_cache(model, "fp8", False, torch.bfloat16)
    kv = [torch.zeros(2, nblocks + 1, bs, cfg.num_key_value_heads, cfg.head_dim, dtype=dtype,
                      device="cuda") for _ in range(cfg.num_hidden_layers)]
    ModelRunner(model, kv, torch.device("cuda"), bs)  # binds the caches and their scales
    i32 = dict(dtype=torch.int32, device="cuda")
    md = AttentionMetadata(n, torch.arange(bs, bs + n, device="cuda"), [0, n], [n],
                           torch.arange(1, nblocks + 1, **i32)[None],
                           torch.tensor([0, n], **i32), torch.tensor([n], **i32), n)
    with torch.inference_mode(), pytest.MonkeyPatch.context() as patch:
        if not kernels:
            patch.setattr(attention, "use_kernels", lambda q: False)
        ids_t = torch.tensor(ids, device="cuda")
        return model.compute_logits(model(ids_t, torch.arange(n, device="cuda"), md))


def test_fp8_kernels_close_to_the_torch_path(hf_dir):
    got = _fp8_prompt_logits(hf_dir)
    want = _fp8_prompt_logits(hf_dir, kernels=False)
    bf16 = our_prompt_logits(hf_dir, PROMPTS[0], torch.bfloat16)
    err = ((got - want).abs().max() / want.abs().max()).item()
    assert err < 4e-2, f"relative logits error {err:.2e}"
    assert (got - want).abs().mean() < (got - bf16).abs().mean()  # fp8 is in effect


@pytest.mark.parametrize("calculate", [False, True])
def test_fp8_cuda_graphs_match_eager(hf_dir, calculate):
    """With calculate_kv_scales the graphs are captured before the scales are known: the
    device-side flag computes them at the first step with tokens, graph or not (here the
    first step, 73 prompt tokens, runs eagerly in both engines: the same scales). Tokens:
    vLLM's check_logprobs_close (a last-bit difference between the graph's and the eager
    kernels' sums may flip one fp8 rounding and break a near tie)."""
    graphs, g_lps, g = greedy(hf_dir, "cuda", "bfloat16", logprobs=5,
                              calculate_kv_scales=calculate, **FP8)
    eager, e_lps, e = greedy(hf_dir, "cuda", "bfloat16", enforce_eager=True, logprobs=5,
                             async_scheduling=False, calculate_kv_scales=calculate, **FP8)
    assert g.model_runner.cudagraphs is not None
    for engine in (g, e):
        assert all(m.kv_cache.dtype == torch.float8_e4m3fn for m in _layers(engine))
    g_scales = [(m.k_scale.item(), m.v_scale.item()) for m in _layers(g)]
    assert g_scales == [(m.k_scale.item(), m.v_scale.item()) for m in _layers(e)]
    assert all((s != (1.0, 1.0)) == calculate for s in g_scales)
    check_logprobs_close((graphs, g_lps), (eager, e_lps))
    same = sum(x == y for a, b in zip(graphs, eager) for x, y in zip(a, b))
    assert same >= 0.9 * sum(len(t) for t in eager)


def test_fp8_doubles_the_blocks_on_cuda(hf_dir):
    _, _, auto = greedy(hf_dir, "cuda", "bfloat16", enforce_eager=True,
                        kv_cache_memory_bytes=64 << 20)
    _, _, fp8 = greedy(hf_dir, "cuda", "bfloat16", enforce_eager=True, **FP8)
    assert fp8._inproc_core().num_gpu_blocks == 2 * auto._inproc_core().num_gpu_blocks
