"""Host time of a Triton launch: Triton's JITFunction.run against kernels/launch_cache.py's
cached launch, on two kernels of a Llama-8B batch-1 decode step whose GPU time stays below
the host's (RMSNorm of [1, 4096]; a dense GEMV of [1, 4096] x [512, 4096]), and the two
launchers around them (checks, output allocation). Each row: us of CPU per launch over
--iters launches (the queue drained between repeats), median of --repeats. On the device:

    python3 examples/bench/launch_overhead.py [--iters 5000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from libvllm.kernels.gemv import _dense_gemv_kernel, dense_gemv  # noqa: E402
from libvllm.kernels.launch_cache import CachedLaunch  # noqa: E402
from libvllm.kernels.rms_norm import _rms_norm_kernel, rms_norm  # noqa: E402


def per_launch_us(fn, iters: int, repeats: int) -> float:
    fn()
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        times.append((time.perf_counter() - t0) / iters * 1e6)
        torch.cuda.synchronize()
    return statistics.median(times)


def kernel_rows(name: str, kernel: CachedLaunch, grid: tuple, args: tuple, kwargs: dict,
                iters: int, repeats: int) -> list[tuple[str, float]]:
    """The same launch through Triton (kernel.fn) and through the cache."""
    triton_path = kernel.fn[grid]
    cached_path = kernel[grid]
    return [(f"{name}: JITFunction.run", per_launch_us(lambda: triton_path(*args, **kwargs),
                                                       iters, repeats)),
            (f"{name}: cached launch", per_launch_us(lambda: cached_path(*args, **kwargs),
                                                     iters, repeats))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    dev, bf16 = "cuda", torch.bfloat16
    x = torch.randn(1, 4096, dtype=bf16, device=dev)  # [1, 4096]
    w = torch.randn(4096, dtype=bf16, device=dev)  # [4096]
    out = torch.empty_like(x)
    wd = torch.randn(512, 4096, dtype=bf16, device=dev) * 0.01  # [512, 4096]
    y = torch.empty(1, 512, dtype=bf16, device=dev)  # [1, 512]
    pdl = {"USE_PDL": True, "launch_pdl": True}
    rows = kernel_rows("rms_norm kernel", _rms_norm_kernel, (1,),
                       (x, x, w, out, 4096, 4096, 0, 4096, 1e-5, 0.0),
                       {"HAS_RESIDUAL": False, "BLOCK": 4096, "num_warps": 8, **pdl},
                       a.iters, a.repeats)
    rows += kernel_rows("dense_gemv kernel", _dense_gemv_kernel, (512 // 8,),
                        (x, wd, wd, y, 512, 4096),
                        {"HAS_BIAS": False, "EVEN_K": True, "SILU_AND_MUL": False, "BN": 8,
                         "BK": 512, "num_warps": 8, "num_stages": 2, **pdl},
                        a.iters, a.repeats)
    rows.append(("rms_norm() launcher, cached",
                 per_launch_us(lambda: rms_norm(x, w, 1e-5), a.iters, a.repeats)))
    rows.append(("dense_gemv() launcher, cached",
                 per_launch_us(lambda: dense_gemv(x, wd), a.iters, a.repeats)))
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    for name, us in rows:
        print(f"{name:40s} {us:8.2f} us")


if __name__ == "__main__":
    main()
