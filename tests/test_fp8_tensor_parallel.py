"""FP8 checkpoints under tensor parallelism on CPU (gloo): each rank loads its slice of the
fp8 weights and of their scales (block rows / columns, per-channel rows; kv heads
replicated when fewer than ranks), as vLLM's scale parameters' loaders do, and TP=2 gives
the TP=1 greedy tokens (tests/test_tensor_parallel.py's oracle), block 16 x 16 so that
every rank's shard is whole blocks (vLLM's validate_fp8_block_shape).
"""

from __future__ import annotations

import pytest

from tests.fp8_reference import write_fp8_pair
from tests.test_models_parity import make_hf_model, make_prompts
from tests.test_tensor_parallel import _generate

pytestmark = pytest.mark.slow
pytest.importorskip("transformers")


@pytest.mark.parametrize("family, scheme, overrides", [
    ("llama", "fp8-block", {"num_key_value_heads": 1}),  # kv head replicated on both ranks
    ("llama", "ct-channel", {}),
    ("qwen3_moe", "fp8-block", {}),
])
def test_tp2_fp8_greedy_tokens_equal_tp1(family, scheme, overrides, tmp_path):
    fp8_dir, _ = write_fp8_pair(make_hf_model(family, **overrides), tmp_path, scheme, (16, 16))
    prompts = make_prompts(300)
    assert _generate(str(fp8_dir), 2, prompts) == _generate(str(fp8_dir), 1, prompts)
