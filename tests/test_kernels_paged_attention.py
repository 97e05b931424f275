"""kernels/decode_attention.py (decode) and kernels/paged_attention.py (prefill/extend)
against the engine's paged attention.

Oracle: paged_attention_{prefill,decode}_ref = engine/layers/attention.py paged_attention_ref
(one SDPA per request over the gathered blocks, causal over the cached prefix, GQA,
sliding window). Mirrors vLLM 0.33 tests/kernels/attention/test_triton_unified_attention.py
(varlen (query_len, kv_len) sets, head pairs (4, 4) (8, 2) (5, 1), random block tables,
sliding windows, tolerance 2e-2 in bf16; its split-K (3D kernel + reduce_segments) cases:
segments over decode and short-query rows, empty segments, graph padding left untouched)
and test_triton_decode_attention.py (split-KV).
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from test_kernels_common import DEVICE, ON_CUDA, cuda_only, gpu

import libvllm.kernels.decode_attention as da
import libvllm.kernels.paged_attention as pa
from libvllm.engine.errors import InvalidArgumentError
from libvllm.kernels._common import pdl_launch, pdl_wait
from libvllm.kernels.decode_attention import paged_attention_decode, paged_attention_decode_ref
from libvllm.kernels.paged_attention import paged_attention_prefill, paged_attention_prefill_ref

NUM_HEADS = [(4, 4), (8, 2), (5, 1)]
TOL = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def _case(seq_lens, nq, nkv, hd, bs, dtype, num_blocks=None, seed=0):
    """-> q [T, nq, hd], kv_cache, query_start_loc, seq_lens, block_table (random blocks)."""
    torch.manual_seed(seed)
    q_lens = [q for q, _ in seq_lens]
    kv_lens = [k for _, k in seq_lens]
    max_blocks = max(1, max((k + bs - 1) // bs for k in kv_lens))
    num_blocks = num_blocks or len(seq_lens) * max_blocks + 3
    q = torch.randn(sum(q_lens), nq, hd, dtype=dtype, device=DEVICE)
    kv = torch.randn(2, num_blocks, bs, nkv, hd, dtype=dtype, device=DEVICE)
    qsl = torch.tensor([0, *q_lens], device=DEVICE).cumsum(0).to(torch.int32)
    lens = torch.tensor(kv_lens, dtype=torch.int32, device=DEVICE)
    bt = torch.randint(0, num_blocks, (len(seq_lens), max_blocks), dtype=torch.int32,
                       device=DEVICE)
    return q, kv, qsl, lens, bt


def _close(out, ref, dtype):
    torch.testing.assert_close(out.float(), ref.float(), atol=TOL[dtype], rtol=TOL[dtype])


SMALL_SEQS = [[(1, 13), (5, 18), (9, 9)], [(1, 5), (1, 1), (1, 33)], [(7, 7)]]


@pytest.mark.parametrize("seq_lens", SMALL_SEQS)
@pytest.mark.parametrize("nq,nkv", NUM_HEADS)
@pytest.mark.parametrize("hd,bs,window,dtype", [
    (32, 4, None, torch.float32),  # head_size 40 pads to 64 lanes; block 16 > tile rows
    (40, 16, 5, torch.float16 if not ON_CUDA else torch.bfloat16),
])
def test_prefill_matches_engine(seq_lens, nq, nkv, hd, bs, window, dtype) -> None:
    q, kv, qsl, lens, bt = _case(seq_lens, nq, nkv, hd, bs, dtype)
    out = paged_attention_prefill(q, kv, qsl, lens, bt, hd**-0.5, sliding_window=window,
                                  block_m=16, tile_n=16)
    _close(out, paged_attention_prefill_ref(q, kv, qsl, lens, bt, hd**-0.5, window), dtype)


@pytest.mark.parametrize("kv_lens", [[13, 1, 40], [0, 7]])
@pytest.mark.parametrize("nq,nkv", NUM_HEADS)
@pytest.mark.parametrize("num_splits,window", [(1, None), (3, 6)])
def test_decode_matches_engine(kv_lens, nq, nkv, num_splits, window) -> None:
    dtype = torch.float32 if not ON_CUDA else torch.bfloat16
    q, kv, _, lens, bt = _case([(1, k) for k in kv_lens], nq, nkv, 32, 4, dtype)
    out = paged_attention_decode(q, kv, bt, lens, 32**-0.5, sliding_window=window,
                                 num_splits=num_splits, tile_n=16)
    _close(out, paged_attention_decode_ref(q, kv, bt, lens, 32**-0.5, window), dtype)


class _NanEmptyTorch:
    """torch for kernels/decode_attention.py, whose torch.empty float buffers start as NaN."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def empty(*shape, **kw):
        t = torch.empty(*shape, **kw)
        return t.fill_(float("nan")) if t.is_floating_point() else t.fill_(-7)


@pytest.mark.parametrize("num_splits", [2, 8, 64])
@pytest.mark.parametrize("window", [None, 20])
def test_decode_splits_beyond_the_tiles(num_splits, window, monkeypatch) -> None:
    """More splits than a row has tiles (a graph captured for 64 splits replayed at a short
    context): the splits without tiles do nothing, a row held by one split is written by the
    decode kernel and skipped by the reduce, the others merge only the splits they used;
    empty rows give zeros. The launcher's float buffers start as NaN, so a reduce that read
    a split no program wrote would not match."""
    monkeypatch.setattr(da, "torch", _NanEmptyTorch())
    dtype = torch.float32 if not ON_CUDA else torch.bfloat16
    q, gate, kv, _, lens, bt = _gated_case([(1, 13), (1, 1), (1, 40), (1, 0), (1, 17)], dtype)
    out = paged_attention_decode(q, kv, bt, lens, 0.2, sliding_window=window,
                                 num_splits=num_splits, tile_n=16, output_gate=gate)
    ref = paged_attention_decode_ref(q.contiguous(), kv, bt, lens, 0.2, window)
    assert torch.isfinite(out).all()
    _close(out, ref * torch.sigmoid(gate), dtype)


# A graph's split count (64: batch-1 decode on the H200) replayed at a short context; under
# the interpreter 8 splits, as many more than the (at most 3) tiles: the same kernel paths at
# an eighth of the programs (the reduce's 64 split lanes: test_decode_splits_beyond_the_tiles)
MANY_SPLITS = 64 if ON_CUDA else 8


@pytest.mark.parametrize("kv_len", [0, 1, 16, 17, 40])
@pytest.mark.parametrize("num_splits,window,hd", [
    (1, None, 32), (3, None, 40), (MANY_SPLITS, 6, 32), (MANY_SPLITS, 20, 40), (1, 20, 32),
])  # hd 40 pads to 64 lanes; window 20 over 40 keys spreads over two splits
def test_decode_one_row(kv_len, num_splits, window, hd, monkeypatch) -> None:
    """A one-row launch (batch-1 decode) loads its first tile's older keys before the PDL
    wait and the newest after it (kernels/decode_attention.py ONE_ROW): it matches the
    engine and, on the CPU, the same row of a two-row launch (the general path) exactly,
    whether the newest key falls in the first tile or a later one; float buffers start NaN."""
    monkeypatch.setattr(da, "torch", _NanEmptyTorch())
    dtype = torch.float32 if not ON_CUDA else torch.bfloat16
    q, kv, _, lens, bt = _case([(1, kv_len), (1, 9)], 8, 2, hd, 4, dtype, seed=kv_len)
    one = paged_attention_decode(q[:1], kv, bt[:1], lens[:1], 0.2, sliding_window=window,
                                 num_splits=num_splits, tile_n=16)
    two = paged_attention_decode(q, kv, bt, lens, 0.2, sliding_window=window,
                                 num_splits=num_splits, tile_n=16)
    _close(one, paged_attention_decode_ref(q[:1], kv, bt[:1], lens[:1], 0.2, window), dtype)
    if not ON_CUDA:
        assert torch.equal(one, two[:1])


LATE_SPINS = 250_000  # ~0.5 ms of the late writer's spin on the H200


@triton.jit
def _late_writer_kernel(k_dst, v_dst, q_dst, k_src, v_src, q_src, n_kv, n_q, spins,
                        BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    """Let the next launch start (pdl_wait), spin, then copy the newest key, value and q."""
    if USE_PDL:
        pdl_wait()
    x = tl.load(k_src).to(tl.float32)
    for _ in range(spins):  # a serial chain of fp32 FMAs: about 2 ns an iteration on the H200
        x = x * 0.999999 + 1e-6
    late = x > -1e30  # always true; the stores depend on the spin
    offs = tl.arange(0, BLOCK)
    tl.store(k_dst + offs, tl.where(late, tl.load(k_src + offs, mask=offs < n_kv), 0),
             mask=offs < n_kv)
    tl.store(v_dst + offs, tl.where(late, tl.load(v_src + offs, mask=offs < n_kv), 0),
             mask=offs < n_kv)
    tl.store(q_dst + offs, tl.where(late, tl.load(q_src + offs, mask=offs < n_q), 0),
             mask=offs < n_q)


@gpu
@pytest.mark.parametrize("kv_len", [40, 100])
def test_decode_one_row_waits_for_the_newest_key(kv_len) -> None:
    """The kernel just before a one-row launch writes the newest key, value and q late (it
    lets the decode launch start, then spins ~0.5 ms under PDL): the decode must read them
    after its wait, so it matches the engine on the final cache; reading them early gives
    the stale zeros. Llama-3.1-8B heads; 40 keys: the newest in the first tile, 100: two."""
    q, kv, _, lens, bt = _case([(1, kv_len)], 32, 8, 128, 16, torch.bfloat16)
    # distinct blocks, as the engine's allocator gives a row: a repeated block would make
    # the late-written slot an older key too, which the kernel may read before its wait
    bt[0] = torch.randperm(kv.shape[1], device=DEVICE)[:bt.shape[1]].to(bt.dtype)
    blk, off = int(bt[0, (kv_len - 1) // 16]), (kv_len - 1) % 16
    # the newest key along its group's mean query: it takes most of the softmax weight
    kv[0, blk, off] = 2 * q[0].view(8, 4, 128).float().mean(1).to(kv.dtype)
    ref = paged_attention_decode_ref(q, kv, bt, lens, 128**-0.5)
    newest = [kv[0, blk, off].clone(), kv[1, blk, off].clone(), q.clone()]
    kv[0, blk, off] = 0
    kv[1, blk, off] = 0
    q_late = torch.zeros_like(q)
    # compiled now, so the launch below follows the writer's at once (a compile in between
    # would outlast its spin and hide the race)
    paged_attention_decode(q_late, kv, bt, lens, 128**-0.5)
    torch.cuda.synchronize()
    _late_writer_kernel[(1,)](kv[0, blk, off], kv[1, blk, off], q_late, *newest,
                              newest[0].numel(), q.numel(), LATE_SPINS, BLOCK=4096,
                              **pdl_launch(q))
    out = paged_attention_decode(q_late, kv, bt, lens, 128**-0.5)
    _close(out, ref, torch.bfloat16)


def test_decode_equals_prefill_with_one_token_per_request() -> None:
    q, kv, qsl, lens, bt = _case([(1, 21), (1, 3)], 8, 2, 32, 4, torch.float32)
    a = paged_attention_decode(q, kv, bt, lens, 0.2, num_splits=2, tile_n=16)
    b = paged_attention_prefill(q, kv, qsl, lens, bt, 0.2, block_m=16, tile_n=16)
    _close(a, b, torch.float32)


def _gated_case(seq_lens, dtype):
    """q and the output gate as Qwen3-Next's strided views of one [T, nq, 2 * hd] tensor
    (each head's [q_h | gate_h]) and the engine's torch result out * sigmoid(gate)."""
    q, kv, qsl, lens, bt = _case(seq_lens, 8, 2, 32, 4, dtype)
    qg = torch.cat([q, torch.randn_like(q) * 3], dim=-1)
    q, gate = qg.chunk(2, dim=-1)
    return q, gate, kv, qsl, lens, bt


@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_output_gate(num_splits) -> None:
    """output_gate: out * sigmoid(gate) in the kernel's store (the reduce's when split)."""
    dtype = torch.float32 if not ON_CUDA else torch.bfloat16
    q, gate, kv, _, lens, bt = _gated_case([(1, 13), (1, 40)], dtype)
    out = paged_attention_decode(q, kv, bt, lens, 0.2, num_splits=num_splits, tile_n=16,
                                 output_gate=gate)
    ref = paged_attention_decode_ref(q.contiguous(), kv, bt, lens, 0.2)
    _close(out, ref * torch.sigmoid(gate), dtype)


@pytest.mark.parametrize("num_segments", [1, 3])
def test_prefill_output_gate(num_segments) -> None:
    q, gate, kv, qsl, lens, bt = _gated_case([(1, 13), (5, 18), (9, 9)], torch.float32)
    out = paged_attention_prefill(q, kv, qsl, lens, bt, 0.2, block_m=16, tile_n=16,
                                  num_segments=num_segments, output_gate=gate)
    ref = paged_attention_prefill_ref(q.contiguous(), kv, qsl, lens, bt, 0.2)
    _close(out, ref * torch.sigmoid(gate), torch.float32)


def test_output_gate_must_match_q() -> None:
    q, gate, kv, _, lens, bt = _gated_case([(1, 5)], torch.float32)
    with pytest.raises(InvalidArgumentError, match="output_gate must be"):
        paged_attention_decode(q, kv, bt, lens, 0.2, output_gate=gate[:, :4])


# a decode row, a chunked prefill over a cached prefix, a long prefill (3 tiles of 16 keys)
SEGMENT_SEQS = [[(1, 100), (6, 37), (33, 33)], [(1, 17), (1, 0), (2, 48)]]


# Under the interpreter half of the product: each head pair with each segment count
# on both sequence sets, one with the window and one without, the (set, window) pairs
# alternating, so that every (set, window) pair also meets every head pair and segment count.
SEGMENT_CASES = [
    (num_segments, seq_lens, nq, nkv, window)
    if (i ^ (window is not None)) == (h + j) % 2 else cuda_only(
        num_segments, seq_lens, nq, nkv, window, why="this head pair and segment count on "
        "the other (sequence set, window) pairs; every pair with them on other cases")
    for j, num_segments in enumerate([1, 3, 8]) for i, seq_lens in enumerate(SEGMENT_SEQS)
    for h, (nq, nkv) in enumerate(NUM_HEADS) for window in [None, 7]]
SEGMENT_IDS = [f"{window}-{nq}-{nkv}-seq_lens{i}-{num_segments}"
               for num_segments in [1, 3, 8] for i in range(len(SEGMENT_SEQS))
               for nq, nkv in NUM_HEADS for window in [None, 7]]


@pytest.mark.parametrize("num_segments,seq_lens,nq,nkv,window", SEGMENT_CASES,
                         ids=SEGMENT_IDS)
def test_prefill_segments_match_engine(num_segments, seq_lens, nq, nkv, window) -> None:
    """KV split into segments (vLLM's 3D kernel) + reduce equals the engine's attention; 8
    segments over at most 3 tiles leave some empty, the window starts them mid-sequence."""
    q, kv, qsl, lens, bt = _case(seq_lens, nq, nkv, 32, 4, torch.float32)
    out = paged_attention_prefill(q, kv, qsl, lens, bt, 0.2, sliding_window=window,
                                  block_m=16, tile_n=16, num_segments=num_segments)
    assert torch.isfinite(out).all()
    _close(out, paged_attention_prefill_ref(q, kv, qsl, lens, bt, 0.2, window), torch.float32)


class _Spy:
    """Records the grids a Triton kernel is launched with (kernel[grid](...))."""

    def __init__(self, kernel) -> None:
        self.kernel, self.grids = kernel, []

    def __getitem__(self, grid):
        self.grids.append(grid)
        return self.kernel[grid]


@pytest.mark.parametrize("sms,segments", [(4, 1), (8, 3), (64, 16)])
def test_prefill_segments_chosen_from_shapes(monkeypatch, sms, segments) -> None:
    """Default: one segment while (q blocks x kv heads) programs fill the SMs, else about two
    programs per SM, at most 16 (6 programs: 8 SMs -> 3); the reduce runs only after a split."""
    monkeypatch.setattr(pa, "_num_sms", lambda device: sms)
    main = _Spy(pa._paged_attention_prefill_kernel)
    reduce = _Spy(pa._paged_attention_decode_reduce_kernel)
    monkeypatch.setattr(pa, "_paged_attention_prefill_kernel", main)
    monkeypatch.setattr(pa, "_paged_attention_decode_reduce_kernel", reduce)
    q, kv, qsl, lens, bt = _case([(1, 40), (3, 30)], 8, 2, 32, 4, torch.float32)
    out = paged_attention_prefill(q, kv, qsl, lens, bt, 0.2, block_m=16, tile_n=16)
    assert main.grids == [(3, 2, segments)]  # 4 tokens // 4 per block + 2 requests, 2 heads
    assert reduce.grids == ([(4, 8)] if segments > 1 else [])
    _close(out, paged_attention_prefill_ref(q, kv, qsl, lens, bt, 0.2), torch.float32)


@pytest.mark.parametrize("empty", ["one", "all"])
def test_segment_reduce_ignores_empty_segments(empty) -> None:
    """An empty segment (m -inf, l 0) must not suppress a strongly negative one; all empty:
    zeros, never NaN (upstream test_reduce_segments_ignores_empty_softmax_states)."""
    out = torch.full((1, 1, 32), float("nan"), device=DEVICE)
    acc = torch.zeros(1, 1, 16, 32, device=DEVICE)
    ml = torch.zeros(1, 1, 16, 2, device=DEVICE)
    ml[..., 0] = float("-inf")
    if empty == "one":
        acc[:, :, 5], ml[:, :, 5] = 6.0, torch.tensor([-1000.0, 2.0])
    end = torch.tensor([1], dtype=torch.int32, device=DEVICE)
    pa._paged_attention_decode_reduce_kernel[(1, 1)](
        acc, ml, out, end, out, out.stride(0), out.stride(1), 0, 0, 1, 32, 16, HEAD_PAD=32,
        SPLITS_PAD=16, GATED=False, USE_PDL=False)
    torch.testing.assert_close(out, torch.full_like(out, 3.0 if empty == "one" else 0.0))


@pytest.mark.parametrize("num_segments", [1, 4])
def test_prefill_leaves_rows_past_query_start_loc_untouched(num_segments) -> None:
    q, kv, qsl, lens, bt = _case([(2, 9), (1, 5)], 4, 2, 16, 4, torch.float32)
    q = torch.cat([q, torch.randn(2, 4, 16, device=DEVICE)])
    out = torch.full_like(q, 123.0)
    paged_attention_prefill(q, kv, qsl, lens, bt, 0.3, out=out, block_m=16, tile_n=16,
                            num_segments=num_segments)
    assert (out[3:] == 123.0).all()
    _close(out[:3], paged_attention_prefill_ref(q[:3], kv, qsl, lens, bt, 0.3), torch.float32)


@pytest.mark.parametrize("num_segments", [1, 3])
@pytest.mark.parametrize("seq_lens,pad_tokens,spare_rows", [
    ([(1, 13), (5, 18), (9, 9)], 1, 4),  # a mixed step padded from 15 to 16 tokens
    ([(1, 5), (1, 1), (1, 33)], 5, 0),  # decodes in a mixed graph, padding, no spare rows
    ([(7, 7)], 0, 3),  # a prefill that fills its bucket exactly
])
def test_prefill_in_a_padded_graph_layout(num_segments, seq_lens, pad_tokens,
                                          spare_rows) -> None:
    """The metadata of a FULL CUDA graph (engine/worker/model_runner.py): tokens padded up
    to the bucket form one more request with seq_len 0 (rows of zeros), request rows past
    it have no tokens; the grid depends only on the padded token and row counts. The
    step's own rows equal the kernel on the unpadded batch and the engine's reference."""
    q, kv, qsl, lens, bt = _case(seq_lens, 8, 2, 32, 4, torch.float32)
    n, total = len(seq_lens), q.shape[0]
    padded = total + pad_tokens
    rows = n + 1 + spare_rows
    q_pad = torch.cat([q, torch.randn(pad_tokens, 8, 32, device=DEVICE)])
    qsl_pad = torch.full((rows + 1,), padded, dtype=torch.int32, device=DEVICE)
    qsl_pad[:n + 1] = qsl
    lens_pad = torch.zeros(rows, dtype=torch.int32, device=DEVICE)
    lens_pad[:n] = lens
    bt_pad = torch.randint(0, kv.shape[1], (rows, bt.shape[1]), dtype=torch.int32,
                           device=DEVICE)  # stale rows: never read past seq_len 0
    bt_pad[:n] = bt
    out = paged_attention_prefill(q_pad, kv, qsl_pad, lens_pad, bt_pad, 0.2, block_m=16,
                                  tile_n=16, num_segments=num_segments)
    _close(out[:total], paged_attention_prefill_ref(q, kv, qsl, lens, bt, 0.2), torch.float32)
    _close(out[:total], paged_attention_prefill(q, kv, qsl, lens, bt, 0.2, block_m=16,
                                                tile_n=16), torch.float32)
    assert torch.isfinite(out).all() and (out[total:] == 0).all()  # padding rows: zeros


def test_attention_rejects_bad_metadata() -> None:
    q, kv, qsl, lens, bt = _case([(2, 5)], 4, 2, 16, 4, torch.float32)
    with pytest.raises(InvalidArgumentError, match="must be a multiple of num_kv_heads"):
        paged_attention_prefill(q[:, :3], kv, qsl, lens, bt, 1.0)
    with pytest.raises(InvalidArgumentError, match="block_table must be"):
        paged_attention_prefill(q, kv, qsl, lens, bt.long(), 1.0)
    with pytest.raises(InvalidArgumentError, match="query_start_loc must be"):
        paged_attention_prefill(q, kv, qsl[:1], lens, bt, 1.0)
    with pytest.raises(InvalidArgumentError, match="seq_lens must be"):
        paged_attention_decode(q[:1], kv, bt, lens.long(), 1.0)
    with pytest.raises(InvalidArgumentError, match="sliding_window must be"):
        paged_attention_decode(q[:1], kv, bt, lens, 1.0, sliding_window=0)
    with pytest.raises(InvalidArgumentError, match="kv_cache must be"):
        paged_attention_decode(q[:1], kv[..., :8], bt, lens, 1.0)
    with pytest.raises(InvalidArgumentError, match="tile_n must be a power of 2 >= 16"):
        paged_attention_decode(q[:1], kv, bt, lens, 1.0, tile_n=8)
    for bad in (0, 257, 2.0):
        with pytest.raises(InvalidArgumentError,
                           match=r"num_segments must be an int in \[1, 256\] or None, got"):
            paged_attention_prefill(q, kv, qsl, lens, bt, 1.0, num_segments=bad)


UPSTREAM_SEQS = [[(1, 1328), (5, 18), (129, 463)], [(1, 523), (1, 37), (1, 2011)]]


@gpu
@pytest.mark.parametrize("seq_lens", UPSTREAM_SEQS)
@pytest.mark.parametrize("nq,nkv", NUM_HEADS)
@pytest.mark.parametrize("hd", [128, 256])
@pytest.mark.parametrize("window", [None, 64, 256])
def test_prefill_upstream_shapes(seq_lens, nq, nkv, hd, window) -> None:
    q, kv, qsl, lens, bt = _case(seq_lens, nq, nkv, hd, 16, torch.bfloat16, num_blocks=2048)
    out = paged_attention_prefill(q, kv, qsl, lens, bt, hd**-0.5, sliding_window=window)
    ref = paged_attention_prefill_ref(q, kv, qsl, lens, bt, hd**-0.5, window)
    _close(out, ref, torch.bfloat16)


@gpu
@pytest.mark.parametrize("batch,kv_len", [(1, 32768), (7, 1000), (64, 1024)])
def test_decode_llama_shapes(batch: int, kv_len: int) -> None:
    q, kv, _, lens, bt = _case([(1, kv_len - i) for i in range(batch)], 32, 8, 128, 16,
                               torch.bfloat16)
    out = paged_attention_decode(q, kv, bt, lens, 128**-0.5)
    _close(out, paged_attention_decode_ref(q, kv, bt, lens, 128**-0.5), torch.bfloat16)


@gpu
@pytest.mark.parametrize("kv_len", [1024, 32768])
def test_prefill_splits_batch1_decode_on_llama_shapes(kv_len: int) -> None:
    """Batch-1 decode in a mixed FULL graph (the request and its padding row, 8 kv heads:
    16 programs) fills the SMs with KV segments and matches one segment and the engine."""
    q, kv, qsl, lens, bt = _case([(1, kv_len), (1, 0)], 32, 8, 128, 16, torch.bfloat16)
    out = paged_attention_prefill(q, kv, qsl, lens, bt, 128**-0.5)
    one = paged_attention_prefill(q, kv, qsl, lens, bt, 128**-0.5, num_segments=1)
    _close(out, paged_attention_prefill_ref(q, kv, qsl, lens, bt, 128**-0.5), torch.bfloat16)
    _close(out, one, torch.bfloat16)
    assert (out[1] == 0).all()


@gpu
def test_attention_64bit_cache_offsets() -> None:
    # a cache of 2 * 66000 * 16 * 8 * 128 > 2^31 elements; the blocks used sit at its end
    q, kv, qsl, lens, bt = _case([(3, 40), (1, 20)], 32, 8, 128, 16, torch.bfloat16,
                                 num_blocks=66000)
    assert kv.numel() > 2**31
    bt = torch.randint(65990, 66000, bt.shape, dtype=torch.int32, device=DEVICE)
    out = paged_attention_prefill(q, kv, qsl, lens, bt, 0.1)
    _close(out, paged_attention_prefill_ref(q, kv, qsl, lens, bt, 0.1), torch.bfloat16)
    dq = q[[2, 3]]
    out = paged_attention_decode(dq, kv, bt, lens, 0.1)
    _close(out, paged_attention_decode_ref(dq, kv, bt, lens, 0.1), torch.bfloat16)


@pytest.mark.parametrize("window", [None, 3])
def test_prefill_ref_is_the_engine_torch_path(window) -> None:
    """The kernels' plain-torch reference equals engine/layers/attention.py, bit for bit."""
    from libvllm.engine.layers.attention import AttentionMetadata, paged_attention_ref

    q, kv, qsl, lens, bt = _case([(1, 13), (5, 18), (9, 9)], 8, 2, 32, 4, torch.float32)
    md = AttentionMetadata(num_actual_tokens=q.shape[0], slot_mapping=torch.empty(0),
                           query_start_loc=qsl.tolist(), seq_lens=lens.tolist(),
                           block_table=bt)
    assert torch.equal(paged_attention_prefill_ref(q, kv, qsl, lens, bt, 0.3, window),
                       paged_attention_ref(q, kv, md, 0.3, window))
