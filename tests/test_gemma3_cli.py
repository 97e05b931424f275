"""Gemma 3 270M (Q4_K_M: mixed Q8_0/Q5_0/Q4_K/Q6_K tensors, SentencePiece vocabulary)
generates through the C CLI. The oracle for the text is the same
request through our Python engine (itself checked against transformers in
tests/test_gemma3_gguf.py): the CLI must stream exactly that greedy text.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from libvllm.engine.config import EngineConfig
from libvllm.engine.llm_engine import LLMEngine
from libvllm.engine.sampling_params import SamplingParams

pytestmark = [pytest.mark.slow, pytest.mark.capi]

GEMMA = Path.home() / ".cache/libvllm/models/gemma-3-270m-Q4_K_M.gguf"
PROMPT = "The capital of France is"


@pytest.mark.skipif(not GEMMA.is_file(), reason=f"{GEMMA} is absent (make fetch-gemma)")
def test_gemma3_generates_through_the_cli(built, child_env):
    run = subprocess.run(
        [str(built / "vllm-cli"), "generate", "-m", str(GEMMA), "-p", PROMPT, "-n", "12",
         "--temp", "0", "--max-model-len", "256"],
        capture_output=True, text=True, env=child_env, timeout=600)
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr and "completion tokens: 12" in run.stderr
    engine = LLMEngine.from_config(EngineConfig(model=str(GEMMA), max_model_len=256))
    engine.add_request("g", PROMPT, SamplingParams(temperature=0.0, max_tokens=12))
    text = ""
    while engine.has_unfinished_requests():
        for out in engine.step():
            text = out.outputs[0].text
    assert run.stdout.strip() == text.strip() and text.strip()
