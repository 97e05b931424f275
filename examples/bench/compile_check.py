"""Compile every variant of the packed GGUF kernels (kernels/gguf_packed.py) for sm_90, no GPU.

The device runs an older Triton than the development machine (3.6 against 3.9), and the CPU
interpreter tests do not compile anything, so a kernel that only the older front end rejects
shows up first on the device. This script runs triton.compile on every (type, flags) variant
the launchers can produce, with whatever Triton the interpreter has, through to the cubin
(the wheel's ptxas). Usage, from the repository root:

    python3 -m venv /tmp/venv36 && /tmp/venv36/bin/pip install triton==3.6.0 numpy torch
    /tmp/venv36/bin/python examples/bench/compile_check.py

Exits 0 when every variant compiles, 1 otherwise (each failure printed).
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo's kernels/, not kernels.py

from kernels.gguf_packed import (  # noqa: E402
    DEQUANT_CONFIG,
    _packed_dequantize_kernel,
    _packed_gemv_kernel,
)
from kernels.gguf_repack import PACKED_TYPES  # noqa: E402

_PTR = {"x_ptr": "*bf16", "qs_ptr": "*i32", "qh_ptr": "*i32", "sc_ptr": "*i16", "d_ptr": "*i32",
        "bias_ptr": "*bf16", "y_ptr": "*bf16", "out_ptr": "*bf16"}
_INT = {"M": "i32", "N": "i32", "NG": "i32", "stride_xm": "i64", "stride_ym": "i64",
        "stride_out": "i64"}


def _source(fn, constexprs: dict) -> triton.compiler.ASTSource:
    """fn specialised as a launch on 16-byte aligned tensors would be."""
    sig = {a: _PTR.get(a) or _INT.get(a) or "constexpr" for a in fn.arg_names}
    aligned = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names) if a in _PTR}
    return triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=aligned)


def variants():
    """(name, fn, constexprs, num_warps) for every kernel the launchers can launch: the
    GEMV at each token tile with gemv_packed_config's BLOCK_N (either prefetch: the sweep
    takes both) and every flag, and the dequantize kernel."""
    block_ns = {1: (4, 8), 2: (4,), 4: (2,), 8: (1,)}  # by BLOCK_M
    tiles = [(bm, bn) for bm, bns in block_ns.items() for bn in bns]
    for qtype, wpg in PACKED_TYPES.items():
        for (bm, bn), prefetch, bias, silu in itertools.product(
                tiles, (False, True), (False, True), (False, True)):
            c = dict(TYPE=int(qtype), WPG=wpg, BLOCK_N=bn, BLOCK_G=64, BLOCK_M=bm,
                     HAS_BIAS=bias, SILU_AND_MUL=silu, PREFETCH=prefetch, ASM=True, USE_PDL=True)
            yield f"gemv {c}", _packed_gemv_kernel, c, 2
        bn, bg, warps = DEQUANT_CONFIG
        c = dict(TYPE=int(qtype), WPG=wpg, BLOCK_N=bn, BLOCK_G=bg, ASM=True)
        yield f"dequantize {c}", _packed_dequantize_kernel, c, warps


def main() -> int:
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args()
    target = GPUTarget("cuda", 90, 32)
    failed = done = 0
    for name, fn, constexprs, warps in variants():
        try:
            triton.compile(_source(fn, constexprs), target=target,
                           options={"num_warps": warps, "launch_pdl": True})
            done += 1
        except Exception as e:  # noqa: BLE001 - report every failing variant
            failed += 1
            print(f"FAIL {name}: {type(e).__name__}: {str(e)[:2000]}", file=sys.stderr)
    print(f"triton {triton.__version__}: {done} variants compiled, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
