"""kernels/chunk_gated_delta_rule.py (chunked prefill kernels) against the torch references.

Mirrors the logic of vLLM 0.33 tests/kernels/mamba/cpu/test_cpu_gdn_ops.py
(test_chunk_gated_delta_rule_cpu: chunked vs recurrent reference, varlen with initial
states) and tests/kernels/fla/test_fused_recurrent_packed_decode.py (state slots written in
place). Oracle: kernels/gated_delta_rule.py gated_delta_rule_varlen_torch (the chunked torch
form per sequence, equal to the naive recurrence: tests/test_kernels_gdn.py) and, for the
gates, the recurrent Triton kernel. On CPU the kernels run under TRITON_INTERPRET=1 in fp32
(and one fp16 case).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_kernels_common import DEVICE, gpu

from libvllm.engine.errors import InvalidArgumentError
from libvllm.kernels.chunk_gated_delta_rule import (
    chunk_gated_delta_rule,
    chunk_sigmoid_gating_delta_rule,
    prepare_chunk_indices,
)
from libvllm.kernels.gated_delta_rule import (
    fused_sigmoid_gating_delta_rule,
    gated_delta_rule_varlen_torch,
)

LENS = [1, 5, 63, 64, 65, 130]


def _qsl(lens: list[int]) -> list[int]:
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return out


def _case(lens, Hk, Hv, dk, dv, device, slots=8):
    T = sum(lens)
    q, k = torch.randn(T, Hk, dk, device=device), torch.randn(T, Hk, dk, device=device)
    v = torch.randn(T, Hv, dv, device=device)
    g, beta = -torch.rand(T, Hv, device=device), torch.rand(T, Hv, device=device)
    states = torch.randn(slots, Hv, dv, dk, device=device) * 0.5
    idx = torch.randperm(slots)[:len(lens)].tolist()  # permuted state slots
    return q, k, v, g, beta, states, idx


def _t(x, dtype=None, device=DEVICE):
    return torch.tensor(x, dtype=dtype, device=device)


def test_prepare_chunk_indices_skips_empty_and_negative_rows() -> None:
    assert prepare_chunk_indices([0, 1, 1, 66, 200], [3, 4, -1, 2]) == [0, 0, 3, 0, 3, 1, 3, 2]


@pytest.mark.parametrize("initial", [True, False])
@pytest.mark.parametrize("d", [32, 64])
def test_chunk_varlen_matches_torch(d: int, initial: bool) -> None:
    torch.manual_seed(d + initial)
    lens = LENS if d == 32 else [5, 65, 130]
    q, k, v, g, beta, states, idx = _case(lens, 1, 2, d, d, DEVICE)
    init = [initial and i % 3 != 1 for i in range(len(lens))]
    qsl = _qsl(lens)
    s_ref, s_tri = states.clone(), states.clone()
    ref = gated_delta_rule_varlen_torch(q, k, v, g, beta, s_ref, qsl, idx, init)
    out = chunk_gated_delta_rule(q, k, v, g, beta, s_tri, _t(qsl, torch.int32), _t(idx),
                                 _t(init))
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(s_tri, s_ref, atol=1e-4, rtol=1e-4)  # final states, slots


def test_chunk_fp16_inputs() -> None:
    """The 16-bit path (dot operands, w and u in the input dtype) on the rounded inputs."""
    torch.manual_seed(5)
    lens = [65, 7]
    q, k, v, g, beta, states, idx = _case(lens, 1, 2, 32, 32, DEVICE)
    q, k, v = q.half(), k.half(), v.half()
    qsl, init = _qsl(lens), [True, False]
    s_ref, s_tri = states.clone(), states.clone()
    ref = gated_delta_rule_varlen_torch(q.float(), k.float(), v.float(), g, beta, s_ref, qsl,
                                        idx, init)
    out = chunk_gated_delta_rule(q, k, v, g, beta, s_tri, _t(qsl, torch.int32), _t(idx),
                                 _t(init))
    torch.testing.assert_close(out.float(), ref, atol=3e-3, rtol=3e-3)
    torch.testing.assert_close(s_tri, s_ref, atol=3e-3, rtol=3e-3)


def test_chunk_skips_rows_and_keeps_out() -> None:
    torch.manual_seed(3)
    lens = [70, 4, 0, 9]
    q, k, v, g, beta, states, _ = _case(lens, 2, 4, 16, 16, DEVICE)
    qsl, idx, init = _qsl(lens), [1, -1, 4, 6], [True, True, False, False]
    s_ref, s_tri = states.clone(), states.clone()
    ref = gated_delta_rule_varlen_torch(q, k, v, g, beta, s_ref, qsl, idx, init)
    out = torch.full_like(v, 7.0)
    chunk_gated_delta_rule(q, k, v, g, beta, s_tri, _t(qsl, torch.int32), _t(idx), _t(init),
                           out=out)
    torch.testing.assert_close(out[70:74], torch.full_like(v[70:74], 7.0))  # skipped row
    keep = torch.cat([torch.arange(70), torch.arange(74, 83)])
    torch.testing.assert_close(out[keep], ref[keep], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(s_tri, s_ref, atol=1e-4, rtol=1e-4)  # slots 4 (empty), 0 kept


def test_chunk_sigmoid_gating_matches_recurrent_kernel() -> None:
    torch.manual_seed(7)
    lens = [66, 3]
    q, k, v, _, _, states, idx = _case(lens, 1, 2, 16, 32, DEVICE)
    ba = torch.randn(sum(lens), 4, device=DEVICE) * 3  # strided a, b as the layer's split
    b, a = ba.split([2, 2], dim=-1)
    A_log, dt_bias = torch.randn(2, device=DEVICE), torch.randn(2, device=DEVICE)
    args = (_t(_qsl(lens), torch.int32), _t(idx), _t([True, False]))
    s_ref, s_tri = states.clone(), states.clone()
    ref = fused_sigmoid_gating_delta_rule(q, k, v, a, b, A_log, dt_bias, s_ref, *args)
    out = chunk_sigmoid_gating_delta_rule(q, k, v, a, b, A_log, dt_bias, s_tri, *args)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(s_tri, s_ref, atol=1e-4, rtol=1e-4)
    assert F.softplus(a).min() >= 0  # the gates decay (g <= 0)


def test_chunk_rejects_bad_heads() -> None:
    with pytest.raises(InvalidArgumentError, match="multiple of key heads"):
        chunk_gated_delta_rule(
            torch.zeros(1, 2, 16), torch.zeros(1, 2, 16), torch.zeros(1, 3, 16),
            torch.zeros(1, 3), torch.zeros(1, 3), torch.zeros(1, 3, 16, 16),
            _t([0, 1], torch.int32, "cpu"), _t([0], device="cpu"), _t([False], device="cpu"))


@gpu
@pytest.mark.parametrize("initial", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_chunk_real_shapes(dtype: torch.dtype, initial: bool) -> None:
    torch.manual_seed(0)
    lens = LENS + [1000]
    q, k, v, g, beta, states, idx = _case(lens, 16, 32, 128, 128, "cuda", slots=10)
    q, k, v = (x.to(dtype) for x in (q, k, v))
    init = [initial] * len(lens)
    qsl = _qsl(lens)
    s_ref, s_tri = states.clone(), states.clone()
    ref = gated_delta_rule_varlen_torch(q.float(), k.float(), v.float(), g, beta, s_ref, qsl,
                                        idx, init)  # on the rounded inputs
    out = chunk_gated_delta_rule(q, k, v, g, beta, s_tri,
                                 _t(qsl, torch.int32, "cuda"), _t(idx, device="cuda"),
                                 _t(init, device="cuda"))
    tol = 5e-2 if dtype == torch.bfloat16 else 1e-3
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)
    torch.testing.assert_close(s_tri, s_ref, atol=tol, rtol=tol)


@gpu
def test_chunk_sigmoid_gating_real_shapes_bf16() -> None:
    """The layer's call: strided q/k/v (split of the conv output) and a/b, bf16, fp32 state,
    against the recurrent kernel."""
    torch.manual_seed(1)
    lens, Hk, Hv, d = [300, 64, 1, 77], 16, 32, 128
    x = torch.randn(sum(lens), (2 * Hk + Hv) * d, device="cuda", dtype=torch.bfloat16)
    q, k, v = (t.unflatten(-1, (-1, d)) for t in x.split([Hk * d, Hk * d, Hv * d], -1))
    ba = torch.randn(sum(lens), 2 * Hv, device="cuda", dtype=torch.bfloat16) * 3
    b, a = ba.split([Hv, Hv], dim=-1)
    A_log, dt_bias = torch.randn(Hv, device="cuda"), torch.randn(Hv, device="cuda")
    states = torch.randn(6, Hv, d, d, device="cuda") * 0.1
    args = (_t(_qsl(lens), torch.int32, "cuda"), _t([4, 1, 0, 5], device="cuda"),
            _t([True, False, True, True], device="cuda"))
    s_ref, s_tri = states.clone(), states.clone()
    ref = fused_sigmoid_gating_delta_rule(q, k, v, a, b, A_log, dt_bias, s_ref, *args)
    out = chunk_sigmoid_gating_delta_rule(q, k, v, a, b, A_log, dt_bias, s_tri, *args)
    torch.testing.assert_close(out.float(), ref.float(), atol=5e-2, rtol=5e-2)
    torch.testing.assert_close(s_tri, s_ref, atol=5e-2, rtol=5e-2)
