"""kernels/causal_conv1d.py and kernels/gated_delta_rule.py against their torch references.

Mirrors the logic of vLLM 0.33 tests/kernels/mamba/test_causal_conv1d.py (varlen with
initial states, batch gather through state indices, padding rows skipped, single-step
update) and tests/kernels/fla/test_fused_recurrent_packed_decode.py (kernel vs reference,
state written in place). Oracles: F.conv1d for the conv; for the delta rule the naive
per-token recurrence and transformers' torch_chunk_gated_delta_rule (when installed).
On CPU the Triton kernels run under TRITON_INTERPRET=1 (test_kernels_common).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_kernels_common import DEVICE, DTYPES, gpu

from libvllm.engine.errors import InvalidArgumentError
from libvllm.kernels.causal_conv1d import causal_conv1d_fn, causal_conv1d_ref
from libvllm.kernels.gated_delta_rule import (
    chunk_gated_delta_rule_torch,
    fused_recurrent_gated_delta_rule,
    fused_sigmoid_gating_delta_rule,
    gated_delta_rule_varlen_torch,
    recurrent_gated_delta_rule_torch,
)


def _qsl(lens: list[int]) -> list[int]:
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return out


def _tol(dtype: torch.dtype) -> dict:
    return {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else \
        {"atol": 2e-2, "rtol": 2e-2}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lens", [[5, 1, 2, 0, 9], [1, 1, 1], [70]])
def test_causal_conv1d_varlen_matches_ref(lens: list[int], dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    dim, K = 40, 4
    qsl = _qsl(lens)
    x = torch.randn(qsl[-1], dim, device=DEVICE).to(dtype)
    w = torch.randn(dim, K, device=DEVICE).to(dtype)
    states = torch.randn(8, K - 1, dim, device=DEVICE).to(dtype)
    idx = [3, -1, 5, 0, 7][:len(lens)]
    init = [True, True, False, True, False][:len(lens)]
    s_ref, s_tri = states.clone(), states.clone()
    ref = causal_conv1d_ref(x, w, s_ref, qsl, idx, init)
    out = causal_conv1d_fn(x, w, s_tri, torch.tensor(qsl, dtype=torch.int32, device=DEVICE),
                           torch.tensor(idx, device=DEVICE), torch.tensor(init, device=DEVICE),
                           max(lens))
    for i, slot in enumerate(idx):
        if slot >= 0:
            torch.testing.assert_close(out[qsl[i]:qsl[i + 1]], ref[qsl[i]:qsl[i + 1]],
                                       **_tol(dtype))
    torch.testing.assert_close(s_tri, s_ref, **_tol(dtype))  # padding slot 1 untouched


@pytest.mark.parametrize("lens", [[1, 1, 1], [70, 1]])  # one launch (decode); two
def test_causal_conv1d_strided_x(lens: list[int]) -> None:
    """x a column slice of a wider row (the in-projection's [q | k | v] part): no copy,
    the same outputs and states as the contiguous input."""
    torch.manual_seed(2)
    dim, K = 24, 4
    qsl = _qsl(lens)
    wide = torch.randn(qsl[-1], dim + 10, device=DEVICE)
    x = wide[:, 3:3 + dim]
    w = torch.randn(dim, K, device=DEVICE)
    states = torch.randn(4, K - 1, dim, device=DEVICE)
    idx, init = [1, 3, 2][:len(lens)], [True, False, True][:len(lens)]
    s_ref, s_tri = states.clone(), states.clone()
    ref = causal_conv1d_ref(x.contiguous(), w, s_ref, qsl, idx, init)
    out = causal_conv1d_fn(x, w, s_tri, torch.tensor(qsl, dtype=torch.int32, device=DEVICE),
                           torch.tensor(idx, device=DEVICE), torch.tensor(init, device=DEVICE),
                           max(lens))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s_tri, s_ref, atol=1e-5, rtol=1e-5)


def test_causal_conv1d_ref_is_conv1d_and_decode_continues() -> None:
    torch.manual_seed(1)
    dim, K, T = 12, 4, 9
    x, w = torch.randn(T, dim), torch.randn(dim, K)
    full = F.silu(F.conv1d(x.t()[None], w[:, None], padding=K - 1, groups=dim)[0, :, :T].t())
    states = torch.zeros(1, K - 1, dim)
    head = causal_conv1d_ref(x[:6], w, states, [0, 6], [0], [False])
    steps = [causal_conv1d_ref(x[t:t + 1], w, states, [0, 1], [0], [True]) for t in range(6, T)]
    torch.testing.assert_close(torch.cat([head, *steps]), full, atol=1e-5, rtol=1e-5)


def test_causal_conv1d_rejects_bad_state_shape() -> None:
    with pytest.raises(InvalidArgumentError, match="shapes do not match"):
        causal_conv1d_fn(torch.zeros(2, 8), torch.zeros(8, 4), torch.zeros(2, 2, 8),
                         torch.tensor([0, 2], dtype=torch.int32), torch.tensor([0]),
                         torch.tensor([False]), 2)


def test_causal_conv1d_rejects_metadata_of_the_wrong_length() -> None:
    args = (torch.zeros(2, 8), torch.zeros(8, 4), torch.zeros(2, 3, 8))
    with pytest.raises(InvalidArgumentError, match=r"has_initial_state \[1\]"):
        causal_conv1d_fn(*args, torch.tensor([0, 2], dtype=torch.int32), torch.tensor([0]),
                         torch.tensor([], dtype=torch.bool), 2)
    with pytest.raises(InvalidArgumentError, match=r"query_start_loc must be \[2\]"):
        causal_conv1d_fn(*args, torch.tensor([0], dtype=torch.int32), torch.tensor([0]),
                         torch.tensor([False]), 2)


def _gdn_inputs(T: int, Hk: int, Hv: int, dk: int, dv: int, B: int = 1):
    q, k = torch.randn(B, T, Hk, dk), torch.randn(B, T, Hk, dk)
    v = torch.randn(B, T, Hv, dv)
    g, beta = -torch.rand(B, T, Hv), torch.rand(B, T, Hv)
    return q, k, v, g, beta


@pytest.mark.parametrize("T", [1, 63, 64, 130])
def test_chunk_matches_naive_recurrence(T: int) -> None:
    torch.manual_seed(T)
    q, k, v, g, beta = _gdn_inputs(T, 2, 4, 16, 8, B=2)
    s0 = torch.randn(2, 4, 8, 16)
    o1, s1 = recurrent_gated_delta_rule_torch(q, k, v, g, beta, s0)
    o2, s2 = chunk_gated_delta_rule_torch(q, k, v, g, beta, s0)
    torch.testing.assert_close(o2, o1, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(s2, s1, atol=1e-5, rtol=1e-4)


def test_chunk_matches_transformers() -> None:
    hf = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    torch.manual_seed(3)
    q, k, v, g, beta = _gdn_inputs(70, 2, 4, 16, 8)
    s0 = torch.randn(1, 4, 8, 16)
    o, s = chunk_gated_delta_rule_torch(q, k, v, g, beta, s0)
    # q/k heads repeated to the value heads as Qwen3NextGatedDeltaNet does: transformers 5.24
    # repeats inside torch_chunk_gated_delta_rule, older releases (the GPU machine's) do not
    qk = [x.repeat_interleave(v.shape[2] // x.shape[2], dim=2) for x in (q, k)]
    o_hf, s_hf = hf.torch_chunk_gated_delta_rule(
        *qk, v, g, beta, initial_state=s0.transpose(-1, -2), output_final_state=True,
        use_qk_l2norm_in_kernel=True)
    torch.testing.assert_close(o, o_hf, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(s, s_hf.transpose(-1, -2), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lens", [[5, 1, 0, 9, 3], [1, 1, 1, 1]])
def test_fused_recurrent_varlen_matches_torch(lens: list[int], dtype: torch.dtype) -> None:
    torch.manual_seed(len(lens))
    Hk, Hv, dk, dv = 2, 4, 16, 8
    qsl = _qsl(lens)
    q, k, v, g, beta = (x[0].to(DEVICE) for x in _gdn_inputs(qsl[-1], Hk, Hv, dk, dv))
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    states = torch.randn(6, Hv, dv, dk, device=DEVICE)
    idx = [2, 0, -1, 5, 1][:len(lens)]
    init = [True, False, True, True, False][:len(lens)]
    s_ref, s_tri = states.clone(), states.clone()
    ref = gated_delta_rule_varlen_torch(q, k, v, g, beta, s_ref, qsl, idx, init)
    out = fused_recurrent_gated_delta_rule(
        q, k, v, g, beta, s_tri, torch.tensor(qsl, dtype=torch.int32, device=DEVICE),
        torch.tensor(idx, device=DEVICE), torch.tensor(init, device=DEVICE))
    torch.testing.assert_close(out, ref, **_tol(dtype))
    torch.testing.assert_close(s_tri, s_ref, **_tol(dtype))


def test_fused_sigmoid_gating_matches_torch_gates() -> None:
    torch.manual_seed(7)
    Hk, Hv, dk, dv = 2, 4, 16, 8
    qsl = _qsl([6, 1, 3])
    q, k, v, _, _ = (x[0].to(DEVICE) for x in _gdn_inputs(qsl[-1], Hk, Hv, dk, dv))
    ba = torch.randn(qsl[-1], 2 * Hv, device=DEVICE) * 3  # strided a, b as the layer's split
    b, a = ba.split([Hv, Hv], dim=-1)
    A_log, dt_bias = torch.randn(Hv, device=DEVICE), torch.randn(Hv, device=DEVICE)
    g = -A_log.exp() * F.softplus(a + dt_bias)
    states = torch.randn(4, Hv, dv, dk, device=DEVICE)
    args = (torch.tensor(qsl, dtype=torch.int32, device=DEVICE),
            torch.tensor([1, 3, 0], device=DEVICE), torch.tensor([True, False, True],
                                                                  device=DEVICE))
    s_ref, s_tri = states.clone(), states.clone()
    ref = fused_recurrent_gated_delta_rule(q, k, v, g, b.sigmoid(), s_ref, *args)
    out = fused_sigmoid_gating_delta_rule(q, k, v, a, b, A_log, dt_bias, s_tri, *args)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s_tri, s_ref, atol=1e-5, rtol=1e-5)


def test_fused_sigmoid_gating_reads_16bit_params() -> None:
    """A_log and dt_bias in the model's dtype are read as fp32 in the kernel (no casts)."""
    torch.manual_seed(8)
    Hk, Hv, dk, dv = 2, 4, 16, 8
    qsl = _qsl([3, 1])
    q, k, v, _, _ = (x[0].to(DEVICE) for x in _gdn_inputs(qsl[-1], Hk, Hv, dk, dv))
    b, a = torch.randn(qsl[-1], 2 * Hv, device=DEVICE).split([Hv, Hv], dim=-1)
    A_log, dt_bias = torch.randn(Hv, device=DEVICE).half(), torch.randn(Hv, device=DEVICE).half()
    states = torch.randn(3, Hv, dv, dk, device=DEVICE)
    args = (torch.tensor(qsl, dtype=torch.int32, device=DEVICE),
            torch.tensor([1, 2], device=DEVICE), torch.tensor([True, True], device=DEVICE))
    s_ref, s_tri = states.clone(), states.clone()
    ref = fused_sigmoid_gating_delta_rule(q, k, v, a, b, A_log.float(), dt_bias.float(),
                                          s_ref, *args)
    out = fused_sigmoid_gating_delta_rule(q, k, v, a, b, A_log, dt_bias, s_tri, *args)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(s_tri, s_ref, atol=1e-6, rtol=1e-6)


def test_fused_recurrent_zero_fill_and_out(monkeypatch) -> None:
    """Its own output (uninitialised memory here) gets zeros on skipped rows and past
    query_start_loc[N]; a given `out` keeps its values there (the chunked kernel's rows)."""
    torch.manual_seed(9)
    Hk, Hv, dk, dv = 2, 4, 16, 8
    lens = [2, 3, 1]
    T = sum(lens) + 2  # two tokens past the rows (graph padding)
    q, k, v, g, beta = (x[0].to(DEVICE) for x in _gdn_inputs(T, Hk, Hv, dk, dv))
    qsl = torch.tensor(_qsl(lens), dtype=torch.int32, device=DEVICE)
    idx, init = torch.tensor([1, -1, 2], device=DEVICE), torch.tensor([1, 1, 0]).bool()
    states = torch.randn(3, Hv, dv, dk, device=DEVICE)
    want = fused_recurrent_gated_delta_rule(q, k, v, g, beta, states.clone(), qsl, idx,
                                            init.to(DEVICE))
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: empty(*a, **kw).fill_(123))
    got = fused_recurrent_gated_delta_rule(q, k, v, g, beta, states.clone(), qsl, idx,
                                           init.to(DEVICE))
    monkeypatch.undo()
    assert (got[2:5] == 0).all() and (got[6:] == 0).all()
    torch.testing.assert_close(got, want)
    out = torch.full_like(v, 123.0)
    fused_recurrent_gated_delta_rule(q, k, v, g, beta, states.clone(), qsl, idx,
                                     init.to(DEVICE), out=out)
    assert (out[2:5] == 123).all() and (out[6:] == 123).all()
    torch.testing.assert_close(out[:2], want[:2])
    torch.testing.assert_close(out[5], want[5])


def test_fused_recurrent_rejects_bad_heads() -> None:
    with pytest.raises(InvalidArgumentError, match="multiple of key heads"):
        fused_recurrent_gated_delta_rule(
            torch.zeros(1, 2, 4), torch.zeros(1, 2, 4), torch.zeros(1, 3, 4),
            torch.zeros(1, 3), torch.zeros(1, 3), torch.zeros(1, 3, 4, 4),
            torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0]), torch.tensor([False]))


@gpu
def test_fused_recurrent_real_shapes_bf16() -> None:
    torch.manual_seed(0)
    Hk, Hv, dk, dv = 16, 32, 128, 128
    qsl = _qsl([300, 1, 77])
    q, k, v, g, beta = (x[0].cuda() for x in _gdn_inputs(qsl[-1], Hk, Hv, dk, dv))
    states = torch.randn(4, Hv, dv, dk, device="cuda") * 0.1
    s_ref, s_tri = states.clone(), states.clone()
    ref = gated_delta_rule_varlen_torch(q, k, v, g, beta, s_ref, qsl, [1, 3, 0],
                                        [True, True, False])
    out = fused_recurrent_gated_delta_rule(
        q.bfloat16(), k.bfloat16(), v.bfloat16(), g, beta, s_tri,
        torch.tensor(qsl, dtype=torch.int32, device="cuda"),
        torch.tensor([1, 3, 0], device="cuda"), torch.tensor([True, True, False], device="cuda"))
    torch.testing.assert_close(out.float(), ref, atol=5e-2, rtol=5e-2)
    torch.testing.assert_close(s_tri, s_ref, atol=5e-2, rtol=5e-2)


@gpu
def test_causal_conv1d_real_shapes_bf16() -> None:
    torch.manual_seed(0)
    dim, K = 8192, 4  # Qwen3.5-35B-A3B conv_dim
    lens = [1000, 1, 1, 37]
    qsl = _qsl(lens)
    x = torch.randn(qsl[-1], dim, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(dim, K, device="cuda", dtype=torch.bfloat16)
    states = torch.randn(6, K - 1, dim, device="cuda", dtype=torch.bfloat16)
    idx, init = [5, 2, 0, 1], [False, True, True, True]
    s_ref, s_tri = states.clone(), states.clone()
    ref = causal_conv1d_ref(x, w, s_ref, qsl, idx, init)
    out = causal_conv1d_fn(x, w, s_tri, torch.tensor(qsl, dtype=torch.int32, device="cuda"),
                           torch.tensor(idx, device="cuda"), torch.tensor(init, device="cuda"),
                           max(lens))
    torch.testing.assert_close(out, ref, atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(s_tri, s_ref)
