"""kernels/sampling.py argmax_rows (the sampler's row argmax, optionally of x - log q) and its
wiring in engine/sample/ops/topk_topp_sampler.py.

Oracle: argmax_rows_ref = torch's (x.float() - q.log()).argmax(-1), whose order (first
maximal index, NaN maximal) the tie and NaN cases also pin with explicit indices. Shapes
cover one and several chunks a row (the interpreter's grid assumes 4 SMs: one row of 4099
takes 5 chunks of 2 steps of 512, one of Llama-3's 128256 8 chunks of 32 steps), a partial
last step, rows of one value, a row stride wider than the row, no rows; on CUDA also
[64, 128256], the engine against torch.log on the device, and a CUDA-graph replay. The
engine's kernel path also runs on CPU under the interpreter through a patched predicate,
and must sample what the torch path samples from the same seeded noise.
Runs on CUDA or under the Triton interpreter (tests/test_kernels_common.py).
"""

from __future__ import annotations

import pytest
import torch
from test_kernels_common import DEVICE, ON_CUDA, gpu

import libvllm.kernels.sampling
from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.sample.metadata import SamplingMetadata
from libvllm.engine.sample.ops import topk_topp_sampler
from libvllm.engine.sample.sampler import Sampler
from libvllm.kernels.sampling import _chunking, argmax_rows, argmax_rows_ref

ALL_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
NAN, INF = float("nan"), float("inf")



def _inputs(rows: int, vocab: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    x = (torch.randn(rows, vocab, device=DEVICE, generator=g) * 3).to(dtype)  # [R, V]
    q = torch.empty(rows, vocab, device=DEVICE).exponential_(generator=g)  # [R, V] fp32
    return x, q


def _check(x: torch.Tensor, q: torch.Tensor | None = None) -> torch.Tensor:
    out = argmax_rows(x, q)
    assert out.shape == (x.shape[0],) and out.dtype == torch.int64
    torch.testing.assert_close(out, argmax_rows_ref(x, q), rtol=0, atol=0)
    return out


@pytest.mark.parametrize("rows", [1, 3, 7])
@pytest.mark.parametrize("vocab", [1, 5, 1000, 4099])
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("noise", [False, True])
def test_argmax_rows_matches_torch(rows: int, vocab: int, dtype: torch.dtype, noise: bool
                                   ) -> None:
    x, q = _inputs(rows, vocab, dtype, seed=rows * vocab)
    _check(x, q if noise else None)


@pytest.mark.parametrize("rows", [1, 3, pytest.param(64, marks=[pytest.mark.gpu, pytest.mark.skipif(
    not ON_CUDA, reason="needs a CUDA device")])])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_argmax_rows_llama3_vocab(rows: int, dtype: torch.dtype) -> None:
    x, q = _inputs(rows, 128256, dtype, seed=rows)  # [rows, 128256]
    _check(x, q)
    _check(x)


def test_ties_take_the_first_index_across_chunks() -> None:
    x = torch.zeros(4, 4099, device=DEVICE)  # [4, 4099]: 2 chunks (interpreter), 9 (H200)
    x[1, [3000, 1500, 4098, 1024, 1023]] = 2.0  # the max in several chunks: 1023 first
    x[2, [4098, 4097]] = 1.0  # only in the partial last step
    x[3] = -INF  # all -inf: index 0, as torch
    ones = torch.ones_like(x)  # log 1 = 0: ties survive the noise
    assert _check(x).tolist() == [0, 1023, 4097, 0]
    assert _check(x, ones).tolist() == [0, 1023, 4097, 0]
    assert _check(x[1:3], ones[1:3]).tolist() == [1023, 4097]  # one row: more chunks
    assert _check(x[1:2]).tolist() == [1023]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy: log 0, -inf - -inf
def test_nan_is_maximal_and_inf_entries() -> None:
    x = torch.randn(5, 4099, device=DEVICE)  # [5, 4099]
    x[0, [3000, 2000]] = NAN  # NaN is maximal, the first one wins
    x[1, 5], x[1, 4000] = INF, NAN  # NaN above +inf, in a later chunk
    x[2, :] = -INF
    x[2, 2500] = -1e30  # the one finite value
    x[3, 7] = INF  # +inf over finite values
    x[4, 100:3000] = -INF
    q = torch.ones_like(x)
    q[3, 9] = 0.0  # -log 0 = +inf at 9: ties with x's +inf at 7, which comes first
    q[4, 1] = 0.0  # +inf at 1
    assert _check(x).tolist()[:4] == [2000, 4000, 2500, 7]
    assert _check(x, q).tolist()[:5] == [2000, 4000, 2500, 7, 1]
    x[3, 7] = -INF  # -inf - log 0 = NaN: maximal, as torch's subtraction then argmax
    q[3, 7] = 0.0
    assert _check(x, q).tolist()[3] == 7


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_stride_wider_than_the_row(dtype: torch.dtype) -> None:
    wide, _ = _inputs(3, 4200, dtype, seed=5)
    x = wide[:, 7:7 + 4099]  # [3, 4099] view: row stride 4200, offset 7
    _, q = _inputs(3, 4099, torch.float32, seed=6)
    _check(x, q)
    _check(x)
    _check(wide[1:2, 50:1050], q[:1, :1000].contiguous())  # one row of a view


def test_no_rows() -> None:
    x, q = _inputs(0, 100, torch.float32)
    assert argmax_rows(x).shape == (0,) and argmax_rows(x, q).dtype == torch.int64


def test_chunking_spreads_a_row_over_the_sms(monkeypatch) -> None:
    """(steps of 512 a chunk, chunks a row) for about 2 programs per SM of a 132-SM H200:
    batch 1 takes 251 chunks of one step; 64 rows 5 chunks a row; a small row one chunk."""
    monkeypatch.setattr(libvllm.kernels.sampling, "_num_sms", lambda device: 132)
    assert _chunking(1, 128256, torch.device(DEVICE)) == (1, 251)
    assert _chunking(64, 128256, torch.device(DEVICE)) == (51, 5)
    assert _chunking(512, 128256, torch.device(DEVICE)) == (251, 1)
    assert _chunking(1, 5, torch.device(DEVICE)) == (1, 1)


@pytest.mark.parametrize("x_shape,x_dtype,q_shape,q_dtype,match", [
    ((16,), torch.float32, None, None, r"x must be \[rows, vocab\]"),
    ((2, 3, 16), torch.float32, None, None, r"x must be \[rows, vocab\]"),
    ((2, 16), torch.int64, None, None, "float32, float16 or bfloat16"),
    ((2, 0), torch.float32, None, None, "vocab > 0"),
    ((2, 16), torch.float32, (2, 15), torch.float32, r"noise_q must be a contiguous float32"),
    ((2, 16), torch.float32, (2, 16), torch.float16, r"noise_q must be a contiguous float32"),
])
def test_argmax_rows_rejects_bad_input(x_shape, x_dtype, q_shape, q_dtype, match) -> None:
    x = torch.zeros(x_shape, dtype=x_dtype, device=DEVICE)
    q = None if q_shape is None else torch.ones(q_shape, dtype=q_dtype, device=DEVICE)
    with pytest.raises(InvalidArgumentError, match=match):
        argmax_rows(x, q)


def test_argmax_rows_rejects_bad_layouts_and_devices() -> None:
    x = torch.zeros(2, 16, device=DEVICE)
    with pytest.raises(InvalidArgumentError, match="contiguous last dimension"):
        argmax_rows(torch.zeros(2, 32, device=DEVICE)[:, ::2])
    with pytest.raises(InvalidArgumentError, match="noise_q must be a contiguous"):
        argmax_rows(x, torch.ones(2, 32, device=DEVICE)[:, :16])
    with pytest.raises(InvalidArgumentError, match="x, noise_q must be on one device"):
        argmax_rows(x, torch.ones(2, 16, device="meta"))


@pytest.fixture
def kernel_calls(monkeypatch) -> list[bool]:
    """Whether each kernels/sampling.py argmax_rows call had noise (the engine imports it
    lazily, per call)."""
    calls: list[bool] = []
    real = libvllm.kernels.sampling.argmax_rows

    def spy(x, noise_q=None):
        calls.append(noise_q is not None)
        return real(x, noise_q)

    monkeypatch.setattr(libvllm.kernels.sampling, "argmax_rows", spy)
    return calls


def _seeded(rows: int, seed: int = 11) -> dict[int, torch.Generator]:
    return {r: torch.Generator(device=DEVICE).manual_seed(seed + r) for r in range(rows)}


def _engine_path(monkeypatch, kernel: bool) -> None:
    """The engine's CUDA branch (kernel) on any device, CPU under the interpreter; or its
    torch path (not kernel), CUDA included."""
    monkeypatch.setattr(topk_topp_sampler, "_use_sampling_kernel", lambda x: kernel and (
        x.dim() == 2 and x.shape[1] > 0 and x.stride(1) == 1))


def _seeded_noise(rows: int, vocab: int) -> torch.Tensor:
    q = torch.empty(rows, vocab, device=DEVICE)  # [rows, vocab]: what random_sample draws
    for row, gen in _seeded(rows).items():
        q[row].exponential_(generator=gen)
    return q


def test_engine_takes_the_kernel_on_cuda_only() -> None:
    use = topk_topp_sampler._use_sampling_kernel
    x = torch.zeros(2, 64, device=DEVICE)  # [2, 64]
    assert use(x) == ON_CUDA and use(x.bfloat16()) == ON_CUDA and use(x[:, 3:40]) == ON_CUDA
    assert not any(use(t) for t in (x[:, ::2], x[0], x[:, :0], x.long(), x[None]))


def test_engine_torch_path(monkeypatch, kernel_calls) -> None:
    """The CPU path, unchanged: logits - log q overwrites the logits, then torch's argmax."""
    _engine_path(monkeypatch, kernel=False)
    x, _ = _inputs(3, 1000, torch.float32)
    noisy = x - _seeded_noise(3, 1000).log()  # [3, 1000]
    logits = x.clone()
    assert torch.equal(topk_topp_sampler.random_sample(logits, _seeded(3)), noisy.argmax(-1))
    assert torch.equal(logits, noisy)  # overwritten, as the torch path always did
    assert torch.equal(topk_topp_sampler.argmax_rows(x), x.argmax(-1))
    assert kernel_calls == []


@pytest.mark.parametrize("rows,vocab", [(1, 1000), (4, 4099)])
def test_engine_kernel_path_samples_as_the_torch_path(monkeypatch, kernel_calls, rows: int,
                                                      vocab: int) -> None:
    """Same seeded noise, same token; the kernel leaves the logits as they were."""
    _engine_path(monkeypatch, kernel=True)
    x, _ = _inputs(rows, vocab, torch.float32, seed=vocab)
    logits = x.clone()
    got = topk_topp_sampler.random_sample(logits, _seeded(rows))
    assert torch.equal(got, (x - _seeded_noise(rows, vocab).log()).argmax(-1))
    assert torch.equal(logits, x)
    assert torch.equal(topk_topp_sampler.argmax_rows(x), x.argmax(-1))
    assert kernel_calls == [True, False]


def test_sampler_greedy_and_random_rows_on_the_kernel_path(monkeypatch, kernel_calls) -> None:
    x, _ = _inputs(4, 1000, torch.float32, seed=3)
    temp = torch.tensor([0.0, 1.0, 0.7, 0.0], device=DEVICE)
    md = SamplingMetadata(temperature=temp, all_greedy=False, all_random=False,
                          generators=_seeded(4))
    _engine_path(monkeypatch, kernel=False)
    expect = Sampler()(x.clone(), md).sampled_token_ids
    _engine_path(monkeypatch, kernel=True)
    md.generators = _seeded(4)
    got = Sampler()(x.clone(), md).sampled_token_ids
    assert torch.equal(got, expect)
    assert got[0] == x[0].argmax() and got[3] == x[3].argmax()
    assert kernel_calls == [False, True]  # the greedy argmax, then the random sample


@gpu
def test_engine_samples_on_cuda_as_torch(kernel_calls) -> None:
    """libdevice's logf against torch.log on the device: the same tokens from the same
    seeded noise over 64 rows of Llama-3's vocab."""
    x, _ = _inputs(64, 128256, torch.float32, seed=9)
    got = topk_topp_sampler.random_sample(x.clone(), _seeded(64))
    assert torch.equal(got, (x - _seeded_noise(64, 128256).log()).argmax(-1))
    assert kernel_calls == [True]


@gpu
def test_argmax_rows_replays_in_a_cuda_graph() -> None:
    x, q = _inputs(8, 128256, torch.float32, seed=1)
    argmax_rows(x, q)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = argmax_rows(x, q)
    x2, q2 = _inputs(8, 128256, torch.float32, seed=2)
    x.copy_(x2)
    q.copy_(q2)
    graph.replay()
    torch.testing.assert_close(out, argmax_rows_ref(x2, q2), rtol=0, atol=0)


def test_warm_up_compiles_every_variant(monkeypatch) -> None:
    """warm_up_sampling_kernels (the profile run's) takes the kernel greedy and random, at one
    row and at all rows (the merge's two lane counts on an H200), and nothing off CUDA."""
    calls: list[tuple[int, bool]] = []
    real = libvllm.kernels.sampling.argmax_rows
    monkeypatch.setattr(libvllm.kernels.sampling, "argmax_rows", lambda x, noise_q=None: (
        calls.append((x.shape[0], noise_q is not None)), real(x, noise_q))[1])
    x, _ = _inputs(6, 1000, torch.bfloat16)  # [6, 1000]
    topk_topp_sampler.warm_up_sampling_kernels(x)
    assert (calls == []) != ON_CUDA
    calls.clear()
    _engine_path(monkeypatch, kernel=True)
    topk_topp_sampler.warm_up_sampling_kernels(x)
    assert sorted(calls) == [(1, False), (1, True), (6, False), (6, True)]
