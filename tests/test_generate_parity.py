"""End-to-end generation on the real default model (SmolLM2-135M-Instruct Q4_1).

Oracle: Hugging Face transformers in fp32 loading the same GGUF (it dequantizes with
the gguf package), greedy `generate`. Also engine invariants, the end-to-end checks of
the scheduler (vLLM tests/v1/core are ported as unit tests in test_scheduler.py,
test_prefix_caching.py, test_kv_cache_utils.py): batching invariance (4 requests together
give exactly the tokens each gives alone); greedy tokens unchanged with prefix caching
off, with chunked prefill, under preemption (FCFS, and priority with prefix caching);
prefix-cache hits of a repeated prompt visible in the engine stats; a KV budget too small
for max_model_len fails at start-up.
"""

from __future__ import annotations

import pytest
import torch

from libvllm.engine.config import EngineConfig
from libvllm.engine.errors import OutOfResourcesError
from libvllm.engine.llm_engine import LLMEngine
from libvllm.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.slow

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a terse assistant."},
     {"role": "user", "content": "Name three primary colors."}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
]


def _run(engine: LLMEngine, prompts: list[list[int]], params: list[SamplingParams]):
    for i, (p, sp) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(f"r{i}", p, sp)
    out: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                out[o.request_id] = o.outputs[0].token_ids
    return [out[f"r{i}"] for i in range(len(prompts))]


def _greedy(n: int = 32, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, **kw)


@pytest.fixture(scope="module")
def engine(model_path):
    return LLMEngine.from_config(EngineConfig(model=model_path, max_model_len=1024))


@pytest.fixture(scope="module")
def chat_prompts(engine):
    return [engine.tokenizer.encode(engine.apply_chat_template(c), add_special_tokens=False)
            for c in CHATS]


@pytest.fixture(scope="module")
def greedy_24(engine, chat_prompts):
    """The default engine's greedy 24-token answers: the oracle of the settings below."""
    return _run(engine, chat_prompts, [_greedy(24) for _ in chat_prompts])


@pytest.fixture(scope="module")
def hf_model(hf_test_model):
    return hf_test_model


def test_greedy_matches_transformers(engine, chat_prompts, hf_model):
    ours = _run(engine, chat_prompts, [_greedy() for _ in chat_prompts])
    eos = engine.tokenizer.eos_token_id
    for prompt, got in zip(chat_prompts, ours, strict=True):
        with torch.no_grad():
            ref = hf_model.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False,
                                    eos_token_id=eos, pad_token_id=eos)
        assert got == ref[0, len(prompt):].tolist()


def test_capital_of_france_mentions_paris(engine, greedy_24):
    # the greedy answer to the first chat (its 24 tokens name the city): no run of its own
    assert "Paris" in engine.tokenizer.decode(greedy_24[0])


def test_batched_equals_alone(engine, chat_prompts):
    # 16 tokens each: invariance does not depend on the length (4 sequential runs alone)
    prompts = chat_prompts + [engine.tokenizer.encode("The quick brown fox")]
    alone = [_run(engine, [p], [_greedy(16)])[0] for p in prompts]
    assert _run(engine, prompts, [_greedy(16) for _ in prompts]) == alone


def test_seeded_sampling_is_reproducible_in_any_batch(engine, chat_prompts):
    def sp():
        return SamplingParams(temperature=0.9, top_p=0.9, top_k=50, seed=1234, max_tokens=16)
    alone = _run(engine, chat_prompts[:1], [sp()])[0]
    mixed = _run(engine, chat_prompts, [sp(), _greedy(16), SamplingParams(temperature=1.0)])
    assert mixed[0] == alone


BLOCK_BYTES = 2 * 30 * 16 * 3 * 64 * 4  # K+V, 30 layers, 16 tokens, 3 kv heads x 64, fp32


@pytest.mark.parametrize("overrides", [
    {"enable_prefix_caching": False},
    # chunked prefill: prompts split across steps (vLLM wants budget >= max_num_seqs)
    {"max_num_batched_tokens": 16, "max_num_seqs": 4},
    # 8 usable blocks, no sharing: 3 requests of ~5 blocks each force preemption
    {"kv_cache_memory_bytes": 9 * BLOCK_BYTES, "max_model_len": 128,
     "enable_prefix_caching": False},
    # priority policy with prefix caching on (prompts 0 and 2 share a block): victims by
    # (priority, arrival), resumed requests re-use their cached blocks; 5 usable blocks
    {"kv_cache_memory_bytes": 6 * BLOCK_BYTES, "max_model_len": 80,
     "scheduling_policy": "priority"},
], ids=["no-prefix-caching", "chunked-prefill", "preemption", "priority-preemption"])
def test_greedy_invariant_under_engine_settings(model_path, greedy_24, chat_prompts,
                                                overrides):
    cfg = {"max_model_len": 256, **overrides}
    other = LLMEngine.from_config(EngineConfig(model=model_path, **cfg))
    assert _run(other, chat_prompts, [_greedy(24) for _ in chat_prompts]) == greedy_24
    if "kv_cache_memory_bytes" in overrides:
        assert other.scheduler.num_preemptions > 0
    # nothing leaks: every block is back in the pool
    pool = other.scheduler.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1


def test_kv_budget_too_small_for_max_model_len_fails_fast(model_path):
    with pytest.raises(OutOfResourcesError, match="max seq len"):
        LLMEngine.from_config(EngineConfig(model=model_path, max_model_len=1024,
                                           kv_cache_memory_bytes=10 * BLOCK_BYTES))


def test_repeated_prompt_hits_prefix_cache(engine, chat_prompts):
    before = engine.get_stats()
    queries, hits = before.prefix_cache_queries, before.prefix_cache_hits
    _run(engine, chat_prompts[:1], [_greedy(2)])
    _run(engine, chat_prompts[:1], [_greedy(2)])
    stats = engine.get_stats()
    n = len(chat_prompts[0])
    assert stats.prefix_cache_queries - queries == 2 * n
    # the second run hits every full block but the one holding the last prompt token
    # (the first run may itself hit blocks cached by earlier tests)
    assert stats.prefix_cache_hits - hits >= (n - 1) // 16 * 16
    assert stats.num_running_reqs == 0 and stats.num_waiting_reqs == 0
    assert stats.kv_cache_usage == 0.0
    assert 0.0 < stats.prefix_cache_hit_rate <= 1.0
