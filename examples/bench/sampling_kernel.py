"""Time the sampler's row argmax: the torch chain kernels/sampling.py replaced (q.log(), the
subtraction, a max over 64 chunks, an argmax of their maxima, a gather) against
argmax_rows(x, q), and greedy both ways: us per call over --iters calls timed with CUDA
events, eager (launch costs included) and replayed from one CUDA graph. --vocab: 64 chunks
of >= 1024 (the chain's split). python examples/bench/sampling_kernel.py [--rows 1] ...
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from libvllm.kernels.sampling import argmax_rows  # noqa: E402


def torch_argmax(x: torch.Tensor, chunks: int = 64) -> torch.Tensor:
    """engine/sample/ops/topk_topp_sampler.py argmax_rows before kernels/sampling.py."""
    rows, vocab = x.shape
    maxima, index = x.view(rows, chunks, vocab // chunks).max(dim=-1)  # [rows, chunks] each
    best = maxima.argmax(dim=-1, keepdim=True)  # [rows, 1]
    return (index.gather(1, best) + best * (vocab // chunks)).squeeze(1)


def per_call_us(fn, iters: int, graph: torch.cuda.CUDAGraph | None) -> float:
    side = torch.cuda.Stream()  # warm-up (Triton compiles) off the capture stream
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.synchronize()
    if graph is not None:
        with torch.cuda.graph(graph):
            for _ in range(iters):
                fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(2):  # the first pass warms up, the second is timed
        start.record()
        for _ in range(1 if graph is not None else iters):
            graph.replay() if graph is not None else fn()
        end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / iters


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag, default in (("--rows", 1), ("--vocab", 128256), ("--iters", 200)):
        p.add_argument(flag, type=int, default=default)
    a = p.parse_args()
    x = torch.randn(a.rows, a.vocab, device="cuda") * 3  # [rows, vocab] fp32 logits
    q = torch.empty_like(x).exponential_()  # [rows, vocab] Exp(1) noise
    assert torch.equal(argmax_rows(x, q), torch_argmax(x - q.log()))
    print(f"[{a.rows}, {a.vocab}] fp32, {a.iters} calls: us per call, eager / CUDA graph")
    for name, fn in {"random, torch chain": lambda: torch_argmax(x - q.log()),
                     "random, kernels/sampling.py": lambda: argmax_rows(x, q),
                     "greedy, torch chunked argmax": lambda: torch_argmax(x),
                     "greedy, kernels/sampling.py": lambda: argmax_rows(x)}.items():
        eager, graph = (per_call_us(fn, a.iters, g) for g in (None, torch.cuda.CUDAGraph()))
        print(f"  {name:<30} {eager:8.2f} {graph:8.2f}")
