"""The pooling runner on CUDA: the default SmolLM2 GGUF as an embedding model with CUDA graphs
(prefill chunks replay the mixed graphs) and the engine core in its child process, against
transformers fp32 from the same GGUF (tests/pooling_reference.py): cosine >= 0.9999 in
float32, >= 0.999 in the default bfloat16; a prompt split over chunks pools the same vector.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pooling_reference import MIN_COSINE, TEXTS, cosine, hf_embeddings

from libvllm.engine.config import EngineConfig
from libvllm.engine.llm_engine import LLMEngine
from libvllm.engine.pooling_params import PoolingParams

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _embed(engine: LLMEngine, prompts: list[list[int]]) -> list[np.ndarray]:
    for i, ids in enumerate(prompts):
        engine.add_pooling_request(f"e{i}", ids, PoolingParams())
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            done[out.request_id] = np.array(out.outputs.data)
    return [done[f"e{i}"] for i in range(len(prompts))]


@pytest.mark.parametrize("dtype,min_cosine", [("float32", MIN_COSINE), ("auto", 0.999)])
def test_cuda_embeddings_match_transformers(model_path, hf_test_model, hf_test_tokenizer,
                                            dtype, min_cosine):
    prompts = [hf_test_tokenizer(t).input_ids for t in TEXTS]
    prompts.append(hf_test_tokenizer(" ".join(TEXTS * 12)).input_ids)  # > one 64-token chunk
    want = hf_embeddings(hf_test_model, prompts)
    whole = LLMEngine.from_config(EngineConfig(model_path, device="cuda", dtype=dtype,
                                               runner="pooling", max_model_len=1024))
    try:
        got = _embed(whole, prompts)
    finally:
        whole.shutdown()
    for g, ref in zip(got, want):
        assert cosine(g, ref) >= min_cosine
    chunked = LLMEngine.from_config(EngineConfig(
        model_path, device="cuda", dtype=dtype, runner="pooling", max_model_len=1024,
        max_num_batched_tokens=64, max_num_seqs=8))
    try:
        for a, b in zip(got, _embed(chunked, prompts)):
            assert cosine(a, b) >= 0.99999
    finally:
        chunked.shutdown()
