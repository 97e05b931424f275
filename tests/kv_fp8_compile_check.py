"""Compile-only build of the KV-cache kernels' variants, fp8 and bf16 caches, for sm_90
(Triton's ASTSource + GPUTarget: ptxas runs, no GPU is needed). The interpreter runs no
compiler: a kernel that runs there may not compile (a jit helper returning two types, a
value changing dtype across a runtime branch). tests/test_kv_fp8_compile.py runs
`compile_all` in a process without TRITON_INTERPRET.
"""

from __future__ import annotations

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import libvllm.kernels.decode_attention as da
import libvllm.kernels.gemv_rope_cache as gr
import libvllm.kernels.paged_attention as pa
import libvllm.kernels.reshape_and_cache as rc
import libvllm.kernels.rotary_cache as ro

_FLOATS = {"qk_scale", "eps", "weight_offset"}
_ROPE = {"pos_ptr": "*i64", "slot_ptr": "*i64", "cos_sin_ptr": "*fp32"}
_ATTN = {"bt_ptr": "*i32", "seq_lens_ptr": "*i32", "qsl_ptr": "*i32",
         "part_acc_ptr": "*fp32", "part_ml_ptr": "*fp32"}
_TILES = dict(BLOCK_SIZE=16, TILE_N=64, HEAD_PAD=128, DOT_PREC="tf32", USE_PDL=True)


def _build(kernel, types: dict, consts: dict) -> None:
    """Compile `kernel` with argument types (default: *bf16 pointers, i32 / i64 / fp32
    scalars; None: a None argument) and constexpr values."""
    fn = getattr(kernel, "fn", kernel)
    sig, cx = {}, {}
    for i, (name, p) in enumerate(zip(fn.arg_names, fn.params)):
        if name in consts or types.get(name, "") is None:
            sig[name] = "constexpr"
            cx[(i,)] = consts.get(name)
        elif name in types:
            sig[name] = types[name]
        elif name.endswith("_ptr"):
            sig[name] = "*bf16"
        else:
            sig[name] = "i64" if str(p.annotation) == "i64" else (
                "fp32" if name in _FLOATS else "i32")
    triton.compile(ASTSource(fn, sig, cx), target=GPUTarget("cuda", 90, 32))


def compile_all() -> int:
    """Compile each variant (both cache kinds); -> how many."""
    n = 0
    for fp8 in (False, True):
        cache = "*fp8e4nv" if fp8 else "*bf16"
        kv = {"k_scale_ptr": "*fp32" if fp8 else None, "v_scale_ptr": "*fp32" if fp8 else None,
              "cache_ptr": cache, "k_ptr": cache, "v_ptr": cache}
        _build(rc._reshape_and_cache_kernel, {**kv, "k_ptr": "*bf16", "v_ptr": "*bf16",
                                              "slot_ptr": "*i64"},
               dict(TILE=1024, FP8=fp8, USE_PDL=True))
        n += 1
        for qk in (False, True):
            _build(ro._rotary_embedding_and_cache_kernel,
                   {**kv, **_ROPE, "k_ptr": "*bf16", "v_ptr": "*bf16"},
                   dict(BLOCK_HQ=32, BLOCK_HK=8, BLOCK_D=64, BLOCK_T=1, HEAD_PAD=128,
                        QK_NORM=qk, FP8=fp8, USE_PDL=True))
            n += 1
        for bias in (False, True):
            _build(gr._qkv_gemv_rope_cache_kernel, {**kv, **_ROPE},
                   dict(HEAD=128, HAS_BIAS=bias, EVEN_K=True, BP=4, BK=512, FP8=fp8,
                        USE_PDL=True))
            n += 1
        for split in (False, True):
            for window in (False, True):
                _build(pa._paged_attention_prefill_kernel, {**kv, **_ATTN},
                       dict(_TILES, BLOCK_M=64, BLOCK_Q=16, SPLIT=split, USE_WINDOW=window,
                            GATED=False, FP8=fp8))
                n += 1
                for one_row in (False, True):
                    _build(da._paged_attention_decode_kernel, {**kv, **_ATTN},
                           dict(_TILES, BLOCK_H=16, SPLIT=split, USE_WINDOW=window,
                                GATED=True, ONE_ROW=one_row, FP8=fp8))
                    n += 1
    return n
