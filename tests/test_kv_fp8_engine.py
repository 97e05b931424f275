"""The fp8 KV cache on CPU at scale: the block count at a fixed KV budget (LLMEngine), the
default SmolLM2 model's prompt logits, and a hybrid Gated DeltaNet model (only its
attention layers' KV is fp8, as vLLM's; the GDN state keeps the model dtype).

Oracle: transformers fp32 with K and V rounded through float8_e4m3fn in its attention
(tests/kv_fp8_oracle.py), greedy `generate`; the block count from vLLM's page-size
arithmetic (vllm/v1/kv_cache_interface.py AttentionSpec.page_size_bytes: 2 * block_size *
num_kv_heads * head_size * the cache dtype's bytes): one byte an element, twice the blocks
of a bf16 cache in the same kv_cache_memory_bytes.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
import test_models_parity as parity  # noqa: E402
from kv_fp8_oracle import use_fp8_kv  # noqa: E402
from test_dummy_loader import write_config  # noqa: E402
from test_hybrid_gdn_engine import _hf_greedy, _saved_model  # noqa: E402
from test_kv_fp8 import _attn_layers, _fp8_runner, save_with_scales  # noqa: E402

from libvllm.engine.config import EngineConfig  # noqa: E402
from libvllm.engine.layers.attention import Attention  # noqa: E402
from libvllm.engine.llm_engine import LLMEngine  # noqa: E402
from libvllm.engine.model_loader import load_model  # noqa: E402
from libvllm.engine.sampling_params import SamplingParams  # noqa: E402


def _greedy(engine: LLMEngine, prompts: list[list[int]], n: int) -> list[list[int]]:
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, SamplingParams(temperature=0.0, max_tokens=n))
    out: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                out[o.request_id] = o.outputs[0].token_ids
    return [out[str(i)] for i in range(len(prompts))]


def _kv_caches(engine: LLMEngine) -> list[torch.Tensor]:
    return [m.kv_cache for m in engine.model_runner.model.modules() if isinstance(m, Attention)]


def test_fp8_doubles_the_blocks_of_a_bf16_model(tmp_path) -> None:
    path = write_config(tmp_path, "LlamaForCausalLM")
    blocks = {}
    for kv_dtype in ("auto", "fp8"):
        engine = LLMEngine.from_config(EngineConfig(
            path, device="cpu", load_format="dummy", skip_tokenizer_init=True,
            dtype="bfloat16", kv_cache_dtype=kv_dtype, kv_cache_memory_bytes=1 << 20,
            max_model_len=64, multiprocessing=False))
        blocks[kv_dtype] = engine._inproc_core().num_gpu_blocks
        caches = _kv_caches(engine)
        want = torch.bfloat16 if kv_dtype == "auto" else torch.float8_e4m3fn
        assert all(c.dtype == want and c.shape[1] == blocks[kv_dtype] for c in caches)
        assert sum(c.numel() * c.element_size() for c in caches) <= 1 << 20
        assert len(_greedy(engine, [[1, 2, 3, 4, 5]], 8)[0]) == 8  # the bf16 + fp8 path runs
    assert blocks["fp8"] == 2 * blocks["auto"]


@pytest.mark.slow
def test_default_model_fp8_logits_close_to_oracle(model_path, hf_test_model,
                                                  monkeypatch) -> None:
    """SmolLM2's prompt logits. Its K / V sit so near fp8 rounding boundaries that fp32
    sums in another order than transformers' flip single roundings (0.1 to 0.2 mean
    absolute logit on 40 random tokens, as a 1e-6 relative perturbation of the oracle's
    own K / V does): ours must sit at least twice as close to the fp8 oracle as to the
    unrounded model, and agree with the oracle's greedy token at most positions."""
    ours, cfg, reader = load_model(model_path)
    reader.close()
    monkeypatch.setattr(parity, "bind_kv_caches", _fp8_runner())
    ids = torch.randint(0, cfg.vocab_size, (40,), generator=torch.Generator().manual_seed(1))
    got = parity.prompt_logits(ours, cfg, ids.tolist())
    assert all(m.kv_cache.dtype == torch.float8_e4m3fn for m in _attn_layers(ours))
    with torch.no_grad():
        plain = hf_test_model(ids[None]).logits[0]
        with use_fp8_kv(hf_test_model):
            ref = hf_test_model(ids[None]).logits[0]
    assert 2 * (got - ref).abs().mean() < (got - plain).abs().mean()
    agree = (got.argmax(-1) == ref.argmax(-1)).float().mean()
    assert agree > (got.argmax(-1) == plain.argmax(-1)).float().mean() and agree >= 0.9


@pytest.mark.slow
def test_hybrid_gdn_fp8_attention_kv_only(tmp_path_factory) -> None:
    path, prompts, _ = _saved_model("qwen3_next", tmp_path_factory)
    engine = LLMEngine.from_config(EngineConfig(
        model=path, device="cpu", max_model_len=64, enable_prefix_caching=False,
        skip_tokenizer_init=True, block_size=8, max_num_seqs=4, multiprocessing=False,
        kv_cache_dtype="fp8"))
    caches = _kv_caches(engine)
    assert caches and all(c.dtype == torch.float8_e4m3fn for c in caches)
    gdn = [m for m in engine.model_runner.model.modules() if hasattr(m, "ssm_state")]
    assert gdn and all(m.ssm_state.dtype == torch.float32 and m.conv_state.dtype
                       == torch.float32 for m in gdn)
    got = _greedy(engine, prompts, 12)
    hf = __import__("test_models_hybrid_gdn").make_hf_model("qwen3_next")
    with torch.no_grad(), use_fp8_kv(hf):
        assert got == [_hf_greedy(hf, p, 12) for p in prompts]


@pytest.mark.slow
def test_tensor_parallel_fp8_equals_one_rank(tmp_path) -> None:
    """Every rank's worker allocates fp8 caches with the checkpoint's scales too
    (engine/executor/multiproc_worker.py): TP=2 gives TP=1's greedy tokens
    (tests/test_tensor_parallel.py). Scales that saturate many keys and values make the
    tokens depend on them (a rank with float caches would not)."""
    from tests.test_tensor_parallel import _generate

    save_with_scales(parity.make_hf_model("qwen3"), tmp_path, {0: (0.002, 0.003),
                                                              1: (0.003, 0.002)})
    prompts = parity.make_prompts(300)
    want = _generate(str(tmp_path), 1, prompts, kv_cache_dtype="fp8")
    assert _generate(str(tmp_path), 2, prompts, kv_cache_dtype="fp8") == want
    assert want != _generate(str(tmp_path), 1, prompts)  # the scales change the tokens
