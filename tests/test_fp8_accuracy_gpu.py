"""FP8 accuracy acceptance on CUDA (gpu): the engine in bf16 on an FP8 checkpoint against
the fp32 emulation of the same quantized math, and against its bf16 twin.

Per case (Llama and Qwen3-MoE with block FP8 and compressed-tensors FP8_DYNAMIC,
Qwen3.5-MoE with block FP8; tests/test_fp8_gpu.py's shapes, 128 x 128 blocks), on the same
random weights written by tests/fp8_reference.py and 8 seeded random prompts of 64 token
ids, teacher-forced top-1 (prompt_logprobs=1, tests/fp8_emulation.py):
  - the FP8 engine agrees with transformers fp32 on the dequantized twin with every
    quantized linear's input rounded through float8 as the kernel does
    (tests/fp8_emulation.py Fp8Emulation) on >= 0.99 of the positions;
  - its agreement with the engine in bf16 on the twin is no lower than that bf16 twin's
    agreement with transformers fp32 (no rounding) minus 0.02.
The agreements are printed (`pytest -s`) to be recorded. Mirrors vLLM 0.33
tests/quantization/test_fp8.py (FP8 models load and run against their reference) with a
token-level oracle; `python -m pytest -s -q tests/test_fp8_accuracy_gpu.py` measures it.
"""

from __future__ import annotations

import pytest
import torch

from libvllm.engine.config import EngineConfig
from libvllm.engine.llm_engine import LLMEngine
from tests.fp8_emulation import Fp8Emulation, agreement, engine_top1, hf_top1, random_prompts
from tests.fp8_reference import write_fp8_pair
from tests.test_fp8_gpu import _hf

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("in_process_core"),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
transformers = pytest.importorskip("transformers")

DEVICE = "cuda"
BLOCK = (128, 128)
PROMPTS, LENGTH = 8, 64
MIN_EMULATION_AGREEMENT = 0.99
TWIN_SLACK = 0.02
CASES = [("llama", "fp8-block"), ("llama", "ct-channel"), ("qwen3_moe", "fp8-block"),
         ("qwen3_moe", "ct-channel"), ("qwen3_5_moe", "fp8-block")]


def _engine_top1(path, prompts: list[list[int]]) -> list[list[int]]:
    engine = LLMEngine.from_config(EngineConfig(str(path), device=DEVICE, dtype="bfloat16",
                                                skip_tokenizer_init=True, max_num_seqs=PROMPTS,
                                                kv_cache_memory_bytes=64 << 20))
    try:
        return engine_top1(engine, prompts)
    finally:
        engine.shutdown()


@pytest.mark.parametrize("family, scheme", CASES)
def test_fp8_engine_agrees_with_the_fp32_emulation_and_its_bf16_twin(family, scheme,
                                                                     tmp_path):
    fp8_dir, twin_dir = write_fp8_pair(_hf(family), tmp_path, scheme, BLOCK)
    hf = transformers.AutoModelForCausalLM.from_pretrained(twin_dir, dtype=torch.float32)
    prompts = random_prompts(PROMPTS, LENGTH, hf.config.vocab_size, seed=0)
    with Fp8Emulation(hf.eval(), scheme, BLOCK):  # fp32 on the CPU: exact, no TF32
        emulated = hf_top1(hf, prompts)
    with Fp8Emulation(hf, scheme, BLOCK, rounding=False):  # the same eager experts
        fp32 = hf_top1(hf, prompts)
    fp8, twin = _engine_top1(fp8_dir, prompts), _engine_top1(twin_dir, prompts)
    vs_emulation, vs_twin = agreement(fp8, emulated), agreement(fp8, twin)
    twin_vs_fp32 = agreement(twin, fp32)
    print(f"\nFP8 accuracy {family} {scheme}: fp8 engine vs fp32 emulation {vs_emulation:.4f}, "
          f"fp8 engine vs bf16 twin {vs_twin:.4f}, bf16 twin vs fp32 {twin_vs_fp32:.4f} "
          f"({PROMPTS} x {LENGTH - 1} positions)")
    assert vs_emulation >= MIN_EMULATION_AGREEMENT
    assert vs_twin >= twin_vs_fp32 - TWIN_SLACK
