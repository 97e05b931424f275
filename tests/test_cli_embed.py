"""`vllm-cli embed` (examples/cli/embed.c) end to end on the default SmolLM2 GGUF: one JSON
array per prompt, in prompt order, equal (cosine >= 0.9999) to transformers fp32 with the
converted decoder's pooling rule (tests/pooling_reference.py); --help; usage errors exit 2;
the library's errors (a bad --pooler-config: vLLM's message) exit 1."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
from pooling_reference import MIN_COSINE, TEXTS, cosine, hf_embeddings

pytestmark = [pytest.mark.capi, pytest.mark.slow]


def _cli(built, child_env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(built / "vllm-cli"), "embed", *args], capture_output=True,
                          text=True, env=child_env, timeout=300)


def test_embed_prints_transformers_vectors(built, child_env, model_path, hf_test_model,
                                           hf_test_tokenizer):
    args = [a for t in TEXTS for a in ("-p", t)]
    run = _cli(built, child_env, "-m", model_path, "--max-model-len", "256", *args)
    assert run.returncode == 0, run.stderr
    vectors = [json.loads(line) for line in run.stdout.splitlines()]
    want = hf_embeddings(hf_test_model, [hf_test_tokenizer(t).input_ids for t in TEXTS])
    assert len(vectors) == len(TEXTS)
    for got, ref in zip(vectors, want):
        assert len(got) == 576 and abs(np.linalg.norm(got) - 1) < 1e-5
        assert cosine(got, ref) >= MIN_COSINE


def test_help_usage_and_library_errors(built, child_env, model_path):
    run = _cli(built, child_env, "--help")
    assert run.returncode == 0 and "--pooler-config" in run.stdout and "-p, --prompt" in run.stdout
    for args in ([], ["-p", "x"], ["-m", model_path], ["-m", model_path, "-p"],
                 ["-m", model_path, "-p", "x", "--bogus", "1"],
                 ["-m", model_path, "-p", "x", "--dimensions", "zero"]):
        run = _cli(built, child_env, *args)
        assert run.returncode == 2 and "--help" in run.stderr, (args, run.stderr)
    run = _cli(built, child_env, "-m", model_path, "-p", "x", "--pooler-config",
               '{"normalize": true}')
    assert run.returncode == 1 and "`normalize` was removed" in run.stderr
