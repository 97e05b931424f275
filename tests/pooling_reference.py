"""The embedding oracle of the pooling tests: transformers fp32 (the hf_test_model fixture,
the same GGUF dequantized) with the pooling rule of a decoder converted by vLLM's
`--convert embed` (vllm/model_executor/models/adapters.py as_embedding_model): the final
(normed) hidden state of the last prompt token, L2-normalized."""

from __future__ import annotations

import numpy as np
import torch

TEXTS = ["The capital of France is Paris.", "Embeddings map text to vectors.", "hi"]
MIN_COSINE = 0.9999


@torch.inference_mode()
def hf_embeddings(hf_model, prompts: list[list[int]]) -> list[np.ndarray]:
    out = []
    for ids in prompts:
        hidden = hf_model.model(torch.tensor([ids])).last_hidden_state[0, -1]  # [hidden]
        out.append(torch.nn.functional.normalize(hidden.float(), dim=0).numpy())
    return out


def cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
