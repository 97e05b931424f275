"""engine/layers/attention.py: an eager mixed step whose first rows decode attends those rows
with the decode kernel and the rest with the unified kernel (vLLM's
split_decodes_and_prefills, vllm/v1/attention/backends/utils.py, which its
tests/v1/attention/test_attention_splitting.py checks on decode-first batches), and the
result equals one unified launch over the whole step and the torch reference.

Oracle: kernels/paged_attention.py paged_attention_prefill_ref (one SDPA per request).
Kernels run under the Triton interpreter on CPU, natively on CUDA.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_kernels_common import ON_CUDA, gpu
from test_kernels_paged_attention import _case, _close

import libvllm.kernels.decode_attention as da
from libvllm.engine.layers import attention
from libvllm.engine.layers.attention import Attention, AttentionMetadata, num_leading_decodes
from libvllm.kernels.paged_attention import paged_attention_prefill, paged_attention_prefill_ref


@pytest.mark.parametrize("num_scheduled,want", [
    ([1, 1, 1, 5, 1, 9], 3), ([7, 1, 1], 0), ([1, 1], 2), ([1], 1), ([16], 0),
])
def test_num_leading_decodes(num_scheduled, want) -> None:
    assert num_leading_decodes(np.array(num_scheduled, dtype=np.int32)) == want


@pytest.mark.parametrize("gated,window,strided", [
    (False, None, False), (True, None, False), (False, 6, False), (False, None, True)])
def test_split_step_equals_one_unified_launch(monkeypatch, gated, window, strided) -> None:
    """Three decode rows, a chunked prefill, a decode row after it (the unified kernel's),
    a prefill: the decode kernel gets exactly the first three rows. Also with an output
    gate, a sliding window, and q a strided view (the q rows of a qkv output)."""
    dtype = torch.bfloat16 if ON_CUDA else torch.float32
    seq_lens = [(1, 13), (1, 5), (1, 20), (5, 18), (1, 9), (9, 9)]
    nq, nkv, hd = 8, 2, 32
    q, kv, qsl, lens, bt = _case(seq_lens, nq, nkv, hd, 4, dtype)
    if strided:  # [T, nq + 2 nkv, hd] rows, q the first nq heads of each
        qkv = torch.cat([q, torch.randn(q.shape[0], 2 * nkv, hd, dtype=dtype,
                                        device=q.device)], dim=1)
        q = qkv[:, :nq]
        assert not q.is_contiguous()
    gate = torch.randn_like(q) if gated else None
    monkeypatch.setattr(attention, "use_kernels", lambda x: True)
    layer = Attention(nq, hd, 0.3, nkv, per_layer_sliding_window=window)
    layer.kv_cache = kv
    decode_rows: list[int] = []
    decode = da.paged_attention_decode
    monkeypatch.setattr(da, "paged_attention_decode",
                        lambda q, *a, **kw: decode_rows.append(q.shape[0]) or decode(q, *a, **kw))

    def attend(num_decodes: int) -> torch.Tensor:
        md = AttentionMetadata(q.shape[0], torch.empty(0), qsl.tolist(), lens.tolist(), bt,
                               qsl, lens, max_query_len=9, max_seq_len=20,
                               num_decodes=num_decodes)
        return layer._attend_cuda(q, md, gate).view_as(q)

    split, whole = attend(num_leading_decodes(np.diff(qsl.cpu().numpy()))), attend(0)
    assert decode_rows == [3]
    ref = paged_attention_prefill_ref(q.contiguous(), kv, qsl, lens, bt, 0.3,
                                      sliding_window=window)
    if gated:
        ref = ref * torch.sigmoid(gate)
    _close(split, ref, dtype)
    _close(whole, ref, dtype)


@gpu
def test_prefill_rows_past_any_decode_count_take_one_variant(triton_compiles) -> None:
    """The prefill rows' block table, seq_lens and query_start_loc are slices that start
    past a step's decode rows: whatever their alignment, the unified kernel compiles no new
    variant mid-serving (5 blocks a row: block-table rows of 20 bytes)."""
    q, kv, qsl, lens, bt = _case([(1, 13), (1, 5), (1, 20), (5, 18), (9, 9), (3, 18)], 8, 2,
                                 32, 4, torch.bfloat16)
    assert bt.shape[1] == 5
    outs = []
    for d in (0, 1, 2, 3):  # offsets of 4d bytes into seq_lens and query_start_loc
        if d == 1:
            triton_compiles.clear()
        outs.append(paged_attention_prefill(q[d:], kv, (qsl - d)[d:], lens[d:], bt[d:], 0.3))
    assert triton_compiles == []
    ref = paged_attention_prefill_ref(q, kv, qsl, lens, bt, 0.3)
    for d, out in enumerate(outs):
        _close(out, ref[d:], torch.bfloat16)
