"""The model runner's contract, on CPU (CI): execute_model(scheduler_output, grammar_output),
the grammar bitmask applied to the sampled rows of the listed requests only, and the
persistent input batch (buffers allocated once, block-table rows recycled, slot mapping).

Mirrors vLLM 0.33 tests/v1/worker/test_gpu_model_runner.py (state updates, block table
rows) and the GrammarOutput hand-off of vllm/v1/worker/gpu_model_runner.py
(apply_grammar_bitmask before sampling). Oracle: the bitmask itself (the only allowed
token must be the one sampled) and the slot formula block_id * block_size + offset.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from libvllm.engine.config import EngineConfig
from libvllm.engine.core.sched_output import (
    CachedRequestData,
    GrammarOutput,
    NewRequestData,
    SchedulerOutput,
)
from libvllm.engine.llm_engine import LLMEngine
from libvllm.engine.sampling_params import SamplingParams

VOCAB = 256
GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


@pytest.fixture
def runner(tmp_path):
    d = tmp_path
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": VOCAB, "max_position_embeddings": 256}))
    engine = LLMEngine.from_config(EngineConfig(str(d), device="cpu", load_format="dummy",
                                                skip_tokenizer_init=True, max_num_seqs=4,
                                                max_model_len=128))
    return engine.model_runner


def bitmask_allowing(*token_sets: set[int]) -> torch.Tensor:
    """int32 [n, ceil(V / 32)], bit t of row i set iff t in token_sets[i]."""
    bits = np.zeros((len(token_sets), VOCAB), dtype=np.uint8)
    for i, tokens in enumerate(token_sets):
        bits[i, list(tokens)] = 1
    packed = np.packbits(bits, axis=1, bitorder="little").view(np.int32)
    return torch.from_numpy(packed.copy())


def new_req(req_id: str, prompt: list[int], blocks: list[int]) -> NewRequestData:
    return NewRequestData(req_id, prompt, GREEDY, blocks, 0, list(prompt))


def sched(new: list[NewRequestData], tokens: dict[str, int], cached: CachedRequestData | None
          = None, finished: set[str] | None = None) -> SchedulerOutput:
    return SchedulerOutput(new, cached or CachedRequestData(), tokens, sum(tokens.values()),
                           finished or set())


def test_grammar_bitmask_masks_only_sampled_listed_requests(runner):
    pytest.importorskip("xgrammar")  # the CPU bitmask kernel
    so = sched([new_req("a", [1, 2, 3], [1]), new_req("b", [4, 5, 6, 7, 8], [2]),
                new_req("c", [9, 10], [3])], {"a": 3, "b": 2, "c": 2})  # b: a partial chunk
    free = runner.execute_model(so, None)  # the same prompts again, under a grammar:
    grammar = GrammarOutput(["z", "b2", "c2"],  # z: not scheduled; b2: not sampled
                            bitmask_allowing({1}, {2}, {200}))
    masked = runner.execute_model(sched([new_req("a2", [1, 2, 3], [4]),
                                         new_req("b2", [4, 5, 6, 7, 8], [5]),
                                         new_req("c2", [9, 10], [6])],
                                        {"a2": 3, "b2": 2, "c2": 2}, finished={"a", "b", "c"}),
                                  grammar)
    assert masked.sampled_token_ids[0] == free.sampled_token_ids[0]  # a2: not listed
    assert masked.sampled_token_ids[1] == [] == free.sampled_token_ids[1]
    assert masked.sampled_token_ids[2] == [200] != free.sampled_token_ids[2]
    cont = runner.execute_model(sched([], {"b2": 3, "c2": 1}, CachedRequestData(
        ["b2", "c2"], [[], []], [2, 2]), finished={"a2"}),
        GrammarOutput(["c2", "b2"], bitmask_allowing({7}, {9, 11})))
    assert cont.req_ids == ["b2", "c2"]
    assert cont.sampled_token_ids[0][0] in (9, 11) and cont.sampled_token_ids[1] == [7]


def test_persistent_buffers_rows_and_slots(runner):
    ptrs = [b.gpu.data_ptr() for b in (runner.input_ids, runner.positions, runner.slot_mapping,
                                       runner.query_start_loc, runner.seq_lens)]
    runner.execute_model(sched([new_req("x", list(range(1, 20)), [5, 9]),
                                new_req("y", [3, 4], [7])], {"x": 19, "y": 2}))
    # x: 19 tokens over blocks 5 (16 slots) and 9; y: 2 tokens in block 7 (block size 16)
    want = [5 * 16 + p for p in range(16)] + [9 * 16 + p for p in range(3)] + [7 * 16, 7 * 16 + 1]
    assert runner.slot_mapping.np[:21].tolist() == want
    assert runner.positions.np[:21].tolist() == list(range(19)) + [0, 1]
    assert runner.query_start_loc.np[:3].tolist() == [0, 19, 21]
    assert runner.seq_lens.np[:2].tolist() == [19, 2]
    row_x = runner.requests["x"].row
    out = runner.execute_model(sched([], {"x": 1, "y": 1}, CachedRequestData(
        ["x", "y"], [[], [8]], [19, 2])))
    assert [len(t) for t in out.sampled_token_ids] == [1, 1]
    assert runner.slot_mapping.np[:2].tolist() == [9 * 16 + 3, 7 * 16 + 2]
    assert runner.block_table.num_blocks[runner.requests["y"].row] == 2
    runner.execute_model(sched([new_req("z", [1], [11])], {"z": 1}, finished={"x"}))
    assert runner.requests["z"].row == row_x  # x's freed row is reused
    assert set(runner.requests) == {"y", "z"}
    assert ptrs == [b.gpu.data_ptr() for b in (runner.input_ids, runner.positions,
                                               runner.slot_mapping, runner.query_start_loc,
                                               runner.seq_lens)]
