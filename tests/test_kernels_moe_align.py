"""kernels/moe_align_block_size.py against its torch form and the invariants upstream checks.

Mirrors vLLM 0.33 tests/kernels/moe/test_moe_align_block_size.py (every pair appears once
in its expert's run, runs padded to the block size with the sentinel, expert_ids per block,
num_tokens_post_padded) and the docstring example of moe_align_block_size. Routings: random,
empty experts, one token, all pairs to one expert, top-k 1/2/8, E up to 512. Runs on CUDA
or under the Triton interpreter (tests/test_kernels_common.py).
"""

from __future__ import annotations

import pytest
import torch
from test_kernels_common import DEVICE, cuda_only

from libvllm.engine.errors import InvalidArgumentError
from libvllm.kernels.moe_align_block_size import (
    TRITON_MAX_PAIRS,
    max_num_tokens_padded,
    moe_align_block_size,
    moe_align_block_size_ref,
)


def check_alignment(topk_ids: torch.Tensor, block: int, num_experts: int) -> None:
    sorted_ids, expert_ids, post_pad = moe_align_block_size(topk_ids, block, num_experts)
    want_sorted, want_experts, want_post = moe_align_block_size_ref(topk_ids, block,
                                                                    num_experts)
    total = int(post_pad.item())
    assert total == int(want_post.item()) and total % block == 0
    assert sorted_ids.shape[0] == max_num_tokens_padded(topk_ids.numel(), block, num_experts)
    assert total <= sorted_ids.shape[0]
    assert torch.equal(sorted_ids[:total].cpu(), want_sorted[:total].cpu())
    assert torch.equal(expert_ids[:total // block].cpu(), want_experts[:total // block].cpu())
    # invariants, independent of the reference
    flat = topk_ids.reshape(-1).cpu()
    ids = sorted_ids[:total].cpu().long()
    real = ids[ids < flat.numel()]
    assert sorted(real.tolist()) == list(range(flat.numel()))
    block_expert = expert_ids[:total // block].cpu().long().repeat_interleave(block)
    assert torch.equal(flat[real], block_expert[ids < flat.numel()])
    assert bool((ids <= flat.numel()).all())


@pytest.mark.parametrize("block,m,topk,e", [
    (block, *r) if (block, r[2]) != (64, 512) else cuda_only(
        block, *r, why="512 experts run in blocks of 16, blocks of 64 with the other "
        "routings")
    for block in (16, 64) for r in [(1, 1, 4), (1, 8, 128), (7, 2, 8), (33, 8, 64),
                                    (5, 8, 512), (200, 2, 16)]])
def test_random_routing(block, m, topk, e) -> None:
    g = torch.Generator().manual_seed(m * 31 + e)
    ids = torch.rand(m, e, generator=g).topk(topk, dim=-1).indices.to(torch.int32)
    check_alignment(ids.to(DEVICE), block, e)


def test_all_pairs_to_one_expert_and_empty_experts() -> None:
    ids = torch.full((40, 1), 3, dtype=torch.int32)  # 40 pairs, 7 of 8 experts empty
    check_alignment(ids.to(DEVICE), 16, 8)
    ids = torch.tensor([[0, 7], [7, 0], [0, 7]], dtype=torch.int64)
    check_alignment(ids.to(DEVICE), 16, 8)


def test_more_pairs_than_one_scan_step() -> None:
    ids = torch.randint(0, 6, (700, 2), generator=torch.Generator().manual_seed(0))
    check_alignment(ids.to(DEVICE), 16, 6)


def test_past_the_kernel_limit_the_torch_form_aligns() -> None:
    ids = torch.randint(0, 64, (1100, 8), generator=torch.Generator().manual_seed(1))
    assert ids.numel() > TRITON_MAX_PAIRS
    check_alignment(ids.to(DEVICE), 64, 64)


def test_upstream_docstring_example() -> None:
    ids = torch.tensor([[2, 3, 4], [1, 2, 4], [1, 3, 4], [1, 2, 3]], dtype=torch.int32)
    sorted_ids, expert_ids, post_pad = moe_align_block_size(ids.to(DEVICE) - 1, 4, 4)
    assert int(post_pad.item()) == 16
    assert sorted_ids[:16].tolist() == [3, 6, 9, 12, 0, 4, 10, 12, 1, 7, 11, 12, 2, 5, 8, 12]
    assert expert_ids[:4].tolist() == [0, 1, 2, 3]


def test_bad_arguments() -> None:
    with pytest.raises(InvalidArgumentError, match="integer"):
        moe_align_block_size(torch.zeros(2, 2, device=DEVICE), 16, 4)
    with pytest.raises(InvalidArgumentError, match="block_size"):
        moe_align_block_size(torch.zeros(2, 2, dtype=torch.int32, device=DEVICE), 0, 4)
