"""Architecture parity: each model file against Hugging Face transformers on the same weights.

Checks, for Llama (Llama 3 rope scaling), Mistral (sliding window smaller than the prompt),
Qwen2 (qkv bias, YaRN rope), Qwen3 (q/k norm, head_dim != hidden / heads), Gemma 3 (sliding
+ global layers with their own rope, linear rope scaling on the global ones, final logit
soft cap, query_pre_attn_scalar), Qwen3-MoE (top-k routing with norm_topk_prob, one dense
layer) and Mixtral (top-k MoE): prompt logits within 1e-4 and 16 greedy tokens equal.
Oracle: transformers fp32 (`AutoModelForCausalLM.from_config`, random weights, saved with
save_pretrained as safetensors and loaded by our loader); greedy tokens from HF `generate`.
GGUF twins: the same HF weights written as an F32 GGUF file the way llama.cpp's
convert_hf_to_gguf.py does (tensor names from the gguf package's map, Llama Q/K permuted,
Llama 3 scaling as rope_freqs, Gemma norms as 1 + w) load through our GGUF loader to the
same logits as transformers (llama, qwen2, qwen3, gemma3).
Our side runs the paged-attention path through ModelRunner: two prompts batched, prefill in
chunks, decode one token per step.
Mirrors vLLM 0.33 tests/models/language/generation/test_common.py (HF vs vLLM greedy) with
tiny random-weight configs in place of hub checkpoints.
"""

from __future__ import annotations

import math
import os

import gguf
import numpy as np
import pytest
import torch

from libvllm.engine.core.sched_output import CachedRequestData, NewRequestData, SchedulerOutput
from libvllm.engine.layers.attention import AttentionMetadata
from libvllm.engine.model_loader import load_model
from libvllm.engine.sampling_params import SamplingParams
from libvllm.engine.worker.model_runner import ModelRunner

transformers = pytest.importorskip("transformers")

_COMMON = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=300, max_position_embeddings=256,
               tie_word_embeddings=False)
CONFIGS = {
    "llama": dict(model_type="llama", rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}),
    "mistral": dict(model_type="mistral", sliding_window=8),
    "qwen2": dict(model_type="qwen2", rope_scaling={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}),
    "qwen3": dict(model_type="qwen3", head_dim=32),
    "gemma3": dict(model_type="gemma3_text", head_dim=16, sliding_window=8,
                   layer_types=["sliding_attention", "full_attention"],
                   query_pre_attn_scalar=20, final_logit_softcapping=3.0,
                   tie_word_embeddings=True, rope_parameters={
                       "full_attention": {"rope_type": "linear", "factor": 2.0,
                                          "rope_theta": 1e6},
                       "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
    "qwen3_moe": dict(model_type="qwen3_moe", head_dim=16, num_experts=8, num_experts_per_tok=2,
                      moe_intermediate_size=32, norm_topk_prob=True, mlp_only_layers=[1]),
    "mixtral": dict(model_type="mixtral", num_local_experts=4, num_experts_per_tok=2),
}
PROMPT_LENS = (20, 13)
MAX_TOKENS = 16


def make_hf_model(name: str, dtype: torch.dtype = torch.float32, weight_std: float = 0.2,
                  **overrides):
    """A tiny transformers model with weights large enough for clear greedy margins:
    matrices N(0, weight_std), vectors U(0.5, 1.5); overrides go to the config."""
    kw = {**_COMMON, **CONFIGS[name], **overrides}
    cfg = transformers.AutoConfig.for_model(kw.pop("model_type"), **kw)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, weight_std) if p.dim() > 1 else p.uniform_(0.5, 1.5)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.to(dtype).eval()


def bind_kv_caches(model, cfg, num_blocks: int, block_size: int) -> ModelRunner:
    kv = [torch.zeros(2, num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim)
          for _ in range(cfg.num_hidden_layers)]
    return ModelRunner(model, kv, torch.device("cpu"), block_size)


def prompt_logits(model, cfg, ids: list[int], block_size: int = 8) -> torch.Tensor:
    """Logits of every prompt position, one prefill through the paged attention path."""
    n = len(ids)
    nblocks = math.ceil(n / block_size)
    bind_kv_caches(model, cfg, nblocks + 1, block_size)
    md = AttentionMetadata(n, torch.arange(block_size, block_size * (nblocks + 1))[:n],
                           [0, n], [n], torch.arange(1, nblocks + 1, dtype=torch.int32)[None])
    with torch.inference_mode():
        return model.compute_logits(model(torch.tensor(ids), torch.arange(n), md))


def generate_greedy(model, cfg, prompts: list[list[int]], max_tokens: int = MAX_TOKENS,
                    chunk: int = 6, block_size: int = 8) -> list[list[int]]:
    """Greedy tokens for all prompts batched: chunked prefill, then one token per step."""
    need = [math.ceil((len(p) + max_tokens) / block_size) for p in prompts]
    runner = bind_kv_caches(model, cfg, 1 + sum(need), block_size)
    first = [1 + sum(need[:i]) for i in range(len(prompts))]  # block 0 is the null block
    tokens = [list(p) for p in prompts]
    computed = [0] * len(prompts)
    started: set[int] = set()
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    while any(len(t) - len(p) < max_tokens for t, p in zip(tokens, prompts)):
        new, cached, sched = [], CachedRequestData(), {}
        for i, (t, p) in enumerate(zip(tokens, prompts)):
            if len(t) - len(p) >= max_tokens:
                continue
            sched[str(i)] = min(chunk, len(t) - computed[i])
            if i in started:
                cached.req_ids.append(str(i))
                cached.new_block_ids.append([])
                cached.num_computed_tokens.append(computed[i])
            else:
                new.append(NewRequestData(str(i), list(p), params,
                                          list(range(first[i], first[i] + need[i])), 0))
                started.add(i)
        so = SchedulerOutput(new, cached, sched, sum(sched.values()), set())
        out = runner.execute_model(so)
        for rid, sampled in zip(out.req_ids, out.sampled_token_ids):
            computed[int(rid)] += sched[rid]
            tokens[int(rid)].extend(sampled)
    return [t[len(p):] for t, p in zip(tokens, prompts)]


def make_prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in PROMPT_LENS]


@pytest.fixture(scope="module", params=list(CONFIGS))
def pair(request, tmp_path_factory):
    hf = make_hf_model(request.param)
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    ours, cfg, source = load_model(str(path))
    return request.param, hf, ours, cfg, source


def test_architecture_and_source(pair):
    _, hf, _, cfg, source = pair
    assert cfg.architectures == (hf.config.architectures[0],)
    assert isinstance(source, str) and os.path.isfile(os.path.join(source, "config.json"))
    assert cfg.vocab_size == 300 and cfg.num_hidden_layers == 2


def test_prompt_logits_match_transformers(pair):
    _, hf, ours, cfg, _ = pair
    for ids in make_prompts(cfg.vocab_size):
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0]
        got = prompt_logits(ours, cfg, ids)
        assert (got - ref).abs().max().item() < 1e-4


def test_greedy_tokens_match_transformers(pair):
    _, hf, ours, cfg, _ = pair
    prompts = make_prompts(cfg.vocab_size)
    got = generate_greedy(ours, cfg, prompts)
    for ids, tokens in zip(prompts, got):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False)
        assert tokens == ref[0, len(ids):].tolist()


# --- GGUF twins ---------------------------------------------------------------------------

GGUF_TWINS = {
    "llama": ("llama", {}),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {}),
    # the GGUF form of Gemma 3: every 6th layer global, 1/sqrt(head_dim), no soft cap
    "gemma3": ("gemma3", dict(num_hidden_layers=6, layer_types=None, query_pre_attn_scalar=16,
                              final_logit_softcapping=None)),
}


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    # convert_hf_to_gguf.py LlamaModel.permute: rotate-half rows -> ggml interleaved rows
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


def _head_dim(c) -> int:
    return getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads


def _llama3_rope_factors(hf_cfg) -> np.ndarray:
    # convert_hf_to_gguf.py LlamaModel.generate_extra_tensors
    p = hf_cfg.rope_parameters
    dim = _head_dim(hf_cfg)
    freqs = 1.0 / (p["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    old = p["original_max_position_embeddings"]
    lo_wl, hi_wl = old / p["low_freq_factor"], old / p["high_freq_factor"]
    out = []
    for f in freqs:
        wl = 2 * math.pi / f
        if wl < hi_wl:
            out.append(1.0)
        elif wl > lo_wl:
            out.append(p["factor"])
        else:
            s = (old / wl - p["low_freq_factor"]) / (p["high_freq_factor"] - p["low_freq_factor"])
            out.append(1 / ((1 - s) / p["factor"] + s))
    return np.array(out, dtype=np.float32)


def write_gguf_twin(hf, arch: str, path) -> None:
    c = hf.config
    w = gguf.GGUFWriter(str(path), arch=arch)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(_head_dim(c))
    w.add_value_length(_head_dim(c))
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    rope = c.rope_parameters.get("full_attention", c.rope_parameters)
    w.add_rope_freq_base(rope["rope_theta"])
    if rope["rope_type"] in ("linear", "yarn"):
        w.add_rope_scaling_type(gguf.RopeScalingType(rope["rope_type"]))
        w.add_rope_scaling_factor(rope["factor"])
    if rope["rope_type"] == "yarn":
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    if arch == "gemma3":
        w.add_sliding_window(c.sliding_window)
    names = gguf.get_tensor_name_map(
        next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch), c.num_hidden_layers)
    for hf_name, t in hf.state_dict().items():
        if hf_name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        base, kind = hf_name.rsplit(".", 1)
        a = t.numpy().astype(np.float32)
        if arch == "llama" and base.endswith("q_proj"):
            a = _permute(a, c.num_attention_heads)
        elif arch == "llama" and base.endswith("k_proj"):
            a = _permute(a, c.num_key_value_heads)
        elif arch == "gemma3" and base.endswith("norm"):
            a = a + 1
        w.add_tensor(f"{names.get_name(base)}.{kind}", a)
    if rope["rope_type"] == "llama3":
        w.add_tensor("rope_freqs.weight", _llama3_rope_factors(c))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("name", list(GGUF_TWINS))
def test_gguf_twin_matches_transformers(name, tmp_path):
    arch, overrides = GGUF_TWINS[name]
    hf = make_hf_model(name, **overrides)
    write_gguf_twin(hf, arch, tmp_path / "twin.gguf")
    ours, cfg, reader = load_model(str(tmp_path / "twin.gguf"))
    reader.close()
    assert cfg.architecture == arch
    for ids in make_prompts(cfg.vocab_size):
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0]
        assert (prompt_logits(ours, cfg, ids) - ref).abs().max().item() < 1e-4
