"""Routing (fused_topk, grouped_topk), launch-config selection and backend choice of
engine/layers/fused_moe: CPU only, no Triton needed.

Mirrors vLLM 0.33 tests/kernels/moe/test_grouped_topk.py (grouped_topk against a
per-token loop) and the config lookup of fused_moe.py (get_config_file_name naming,
nearest-M choice in try_get_optimal_moe_config, VLLM_TUNED_CONFIG_FOLDER first, the
default config when no file exists, override_config). vLLM has no unit test of
get_default_config: DEFAULT_CONFIGS transcribes its rule (block FP8, FP8 per tensor,
bf16/fp16, fp32) as a table.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernels/ import

from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.layers.fused_moe import (
    FusedMoE,
    config,
    fused_topk,
    get_config_file_name,
    get_default_config,
    get_moe_configs,
    grouped_topk,
    override_config,
    try_get_optimal_moe_config,
)


def test_fused_topk_softmax_renormalized() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0], [0.0, 0.0, 5.0, 4.0]])
    w, ids = fused_topk(logits, 2, renormalize=True)
    assert ids.dtype == torch.int32 and w.dtype == torch.float32
    assert ids.tolist() == [[1, 2], [2, 3]]
    assert torch.allclose(w.sum(-1), torch.ones(2))
    w_raw, _ = fused_topk(logits, 2, renormalize=False)
    assert torch.allclose(w_raw, torch.softmax(logits, -1).topk(2).values)
    w_sig, _ = fused_topk(logits, 1, renormalize=False, scoring_func="sigmoid")
    assert torch.allclose(w_sig[:, 0], torch.tensor([3.0, 5.0]).sigmoid())


def test_fused_topk_bad_arguments() -> None:
    with pytest.raises(InvalidArgumentError, match="out of range"):
        fused_topk(torch.zeros(2, 4), 5, True)
    with pytest.raises(InvalidArgumentError, match="scoring function"):
        fused_topk(torch.zeros(2, 4), 2, True, scoring_func="relu")


def _grouped_topk_loop(logits, topk, groups, keep, bias):
    scores = torch.softmax(logits.float(), -1)
    ids, weights = [], []
    for row in scores:
        sel = row + (bias if bias is not None else 0)
        per_group = sel.view(groups, -1)
        gscore = per_group.topk(2).values.sum(-1) if bias is not None else per_group.max(-1)[0]
        best = set(gscore.topk(keep).indices.tolist())
        allowed = torch.tensor([i // (row.numel() // groups) in best
                                for i in range(row.numel())])
        top = sel.masked_fill(~allowed, float("-inf")).topk(topk).indices
        ids.append(sorted(top.tolist()))
        w = row[top]
        weights.append(dict(zip(top.tolist(), (w / w.sum()).tolist())))
    return ids, weights


@pytest.mark.parametrize("with_bias", [False, True])
def test_grouped_topk_matches_a_per_token_loop(with_bias) -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(7, 32, generator=g)
    bias = torch.randn(32, generator=g) / 10 if with_bias else None
    w, ids = grouped_topk(logits, 4, True, num_expert_group=8, topk_group=3,
                          e_score_correction_bias=bias)
    want_ids, want_w = _grouped_topk_loop(logits, 4, 8, 3, bias)
    assert [sorted(r) for r in ids.tolist()] == want_ids
    for row_w, row_ids, want in zip(w.tolist(), ids.tolist(), want_w):
        for wi, i in zip(row_w, row_ids):
            assert abs(wi - want[i]) < 1e-6
    w2, _ = grouped_topk(logits, 4, True, 8, 3, routed_scaling_factor=2.5,
                         e_score_correction_bias=bias)
    assert torch.allclose(w2, w * 2.5)


def test_grouped_topk_bad_groups() -> None:
    with pytest.raises(InvalidArgumentError, match="do not split"):
        grouped_topk(torch.zeros(2, 10), 2, True, num_expert_group=4, topk_group=2)


def test_config_file_name_is_upstreams(monkeypatch) -> None:
    assert get_config_file_name(128, 768, None, "NVIDIA_H200") == \
        "E=128,N=768,device_name=NVIDIA_H200.json"
    assert get_config_file_name(8, 14336, "float32", "NVIDIA_H100_80GB_HBM3") == \
        "E=8,N=14336,device_name=NVIDIA_H100_80GB_HBM3,dtype=float32.json"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200 NVL")
    assert config.get_device_name() == "NVIDIA_H200"


def test_block_fp8_file_name_carries_the_block_shape(tmp_path, monkeypatch) -> None:
    """Upstream's ",block_shape=[bn,bk]" suffix for block-quantized FP8 experts, and the
    lookup reads that file (per-tensor FP8 and unquantized files have none)."""
    assert get_config_file_name(256, 512, "fp8_w8a8", "NVIDIA_H200", [128, 128]) == \
        "E=256,N=512,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
    assert get_config_file_name(256, 512, "fp8_w8a8", "NVIDIA_H200") == \
        "E=256,N=512,device_name=NVIDIA_H200,dtype=fp8_w8a8.json"
    monkeypatch.setattr(config, "get_device_name", lambda: "TEST_GPU")
    monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(tmp_path))
    get_moe_configs.cache_clear()
    tuned = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
             "num_warps": 4, "num_stages": 3}
    (tmp_path / "E=6,N=40,device_name=TEST_GPU,dtype=fp8_w8a8,block_shape=[128,128].json"
     ).write_text(json.dumps({"1": tuned}))
    try:
        w1, w2 = (6, 80, 24), (6, 24, 40)
        assert try_get_optimal_moe_config(w1, w2, 2, "fp8_w8a8", 3, [128, 128]) == tuned
        assert try_get_optimal_moe_config(w1, w2, 2, "fp8_w8a8", 3) == \
            get_default_config(3, 6, 40, 24, 2, "fp8_w8a8")
    finally:
        get_moe_configs.cache_clear()


def test_tuned_file_nearest_m_and_folder_order(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(config, "get_device_name", lambda: "TEST_GPU")
    monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(tmp_path))
    get_moe_configs.cache_clear()
    tuned = {str(m): {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": m, "BLOCK_SIZE_K": 64,
                      "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 3}
             for m in (1, 16, 64, 256)}
    (tmp_path / "E=6,N=40,device_name=TEST_GPU.json").write_text(
        json.dumps({**tuned, "triton_version": "3.6.0"}))
    try:
        w1, w2 = (6, 80, 24), (6, 24, 40)
        for m, want_n in [(1, 1), (9, 16), (40, 16), (41, 64), (5000, 256)]:
            assert try_get_optimal_moe_config(w1, w2, 2, None, m)["BLOCK_SIZE_N"] == want_n
        # fp32 has its own file: none here, so the default
        assert try_get_optimal_moe_config(w1, w2, 2, "float32", 40) == \
            get_default_config(40, 6, 40, 24, 2, "float32")
        with override_config({"BLOCK_SIZE_M": 32}):
            assert try_get_optimal_moe_config(w1, w2, 2, None, 1) == {"BLOCK_SIZE_M": 32}
    finally:
        get_moe_configs.cache_clear()


def test_start_up_compiles_a_forward_per_moe_config(tmp_path, monkeypatch) -> None:
    """engine/worker/gpu_worker.py drives a compile-only forward at the first token count of
    each launch config the model's MoE layers pick below the step budget: a tuned table's
    nearest-key runs (ties go to the smaller key), the default's M ranges without a file,
    none for a dense model."""
    from libvllm.engine.worker.gpu_worker import _moe_config_token_counts

    monkeypatch.setattr(config, "get_device_name", lambda: "TEST_GPU")
    monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(tmp_path))
    get_moe_configs.cache_clear()
    tuned = {str(m): {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": n, "BLOCK_SIZE_K": 64,
                      "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 3}
             for m, n in ((1, 32), (64, 64), (1536, 128), (4096, 256))}
    (tmp_path / "E=6,N=40,device_name=TEST_GPU.json").write_text(json.dumps(tuned))
    try:
        moe = torch.nn.Sequential(FusedMoE(6, 2, 24, 40), FusedMoE(6, 2, 24, 40))
        assert _moe_config_token_counts(moe.to(torch.bfloat16), 4096) == [1, 33, 801, 2817]
        assert _moe_config_token_counts(moe.to(torch.bfloat16), 800) == [1, 33]
        default = [m for m in range(1, 4096) if m == 1 or get_default_config(
            m, 6, 40, 24, 2, "float32") != get_default_config(m - 1, 6, 40, 24, 2, "float32")]
        assert _moe_config_token_counts(moe.float(), 4096) == default and len(default) > 1
        assert _moe_config_token_counts(torch.nn.Linear(4, 4), 4096) == []
    finally:
        get_moe_configs.cache_clear()


def _first_counts(rule, limit: int) -> list[int]:
    """The first M below limit of each distinct config rule(M) gives."""
    return [m for m in range(1, limit) if m == 1 or rule(m) != rule(m - 1)]


def test_start_up_compiles_an_fp8_models_own_configs(tmp_path, monkeypatch) -> None:
    """A block-FP8 MoE model (Fp8MoEMethod kept, as on CUDA) warms up the configs of its
    own file name (dtype=fp8_w8a8, block_shape=[128,128]) and, without one, of the
    block-FP8 default, not the bf16 ones."""
    from libvllm.engine.layers.quantization import apply_quant_config
    from libvllm.engine.layers.quantization.fp8 import Fp8Config
    from libvllm.engine.worker.gpu_worker import _moe_config_token_counts

    monkeypatch.setattr(config, "get_device_name", lambda: "TEST_GPU")
    monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(tmp_path))
    get_moe_configs.cache_clear()
    moe = torch.nn.Sequential(FusedMoE(6, 2, 256, 128))
    apply_quant_config(moe, Fp8Config.from_config(
        {"quant_method": "fp8", "activation_scheme": "dynamic",
         "weight_block_size": [128, 128]}))
    assert moe[0].w13_weight.dtype == torch.float8_e4m3fn
    try:
        block = _first_counts(lambda m: get_default_config(
            m, 6, 128, 256, 2, "fp8_w8a8", [128, 128]), 4096)
        bf16 = _first_counts(lambda m: get_default_config(m, 6, 128, 256, 2, None), 4096)
        assert _moe_config_token_counts(moe, 4096) == block == [1, 5, 9, 17, 65]
        assert block != bf16
        tuned = {str(m): {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": n, "BLOCK_SIZE_K": 128,
                          "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 3}
                 for m, n in ((1, 64), (256, 128))}
        (tmp_path / "E=6,N=128,device_name=TEST_GPU.json").write_text(json.dumps(
            {"1": tuned["1"]}))  # the bf16 file: not this model's
        (tmp_path / "E=6,N=128,device_name=TEST_GPU,dtype=fp8_w8a8,block_shape=[128,128]"
                    ".json").write_text(json.dumps(tuned))
        get_moe_configs.cache_clear()
        assert _moe_config_token_counts(moe, 4096) == [1, 129]
    finally:
        get_moe_configs.cache_clear()


# vLLM 0.33 vllm/model_executor/layers/fused_moe/fused_moe.py get_default_config on CUDA
# (current_platform.is_rocm() False, VLLM_BATCH_INVARIANT off), transcribed from its rule:
# (M, E, N, K, topk, dtype, block_shape) -> (BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K,
# GROUP_SIZE_M, num_warps, num_stages); SPLIT_K is 1 in every row.
_B = [128, 128]
DEFAULT_CONFIGS = [
    # block FP8: M tile 16 to M = 64 then 64; N tile 64 for M <= 8 when 64 divides bn
    # (4 stages to M = 4), else bn; K tile bk; GROUP_SIZE_M 32 above M = 16
    ((1, 256, 512, 2048, 8, "fp8_w8a8", _B), (16, 64, 128, 1, 4, 4)),
    ((4, 256, 512, 2048, 8, "fp8_w8a8", _B), (16, 64, 128, 1, 4, 4)),
    ((5, 256, 512, 2048, 8, "fp8_w8a8", _B), (16, 64, 128, 1, 4, 3)),
    ((8, 256, 512, 2048, 8, "fp8_w8a8", _B), (16, 64, 128, 1, 4, 3)),
    ((9, 256, 512, 2048, 8, "fp8_w8a8", _B), (16, 128, 128, 1, 4, 3)),
    ((16, 256, 512, 2048, 8, "fp8_w8a8", _B), (16, 128, 128, 1, 4, 3)),
    ((17, 256, 512, 2048, 8, "fp8_w8a8", _B), (16, 128, 128, 32, 4, 3)),
    ((64, 256, 512, 2048, 8, "fp8_w8a8", _B), (16, 128, 128, 32, 4, 3)),
    ((65, 256, 512, 2048, 8, "fp8_w8a8", _B), (64, 128, 128, 32, 4, 3)),
    ((4096, 256, 512, 2048, 8, "fp8_w8a8", _B), (64, 128, 128, 32, 4, 3)),
    ((1, 128, 768, 2048, 8, "fp8_w8a8", [32, 128]), (16, 32, 128, 1, 4, 3)),
    ((2, 128, 768, 2048, 8, "fp8_w8a8", [192, 64]), (16, 64, 64, 1, 4, 4)),
    # FP8 per tensor / per channel: the general rule with 128-deep K tiles throughout
    ((1, 128, 768, 2048, 8, "fp8_w8a8", None), (16, 64, 128, 1, 4, 4)),
    ((65, 128, 768, 2048, 8, "fp8_w8a8", None), (32, 128, 128, 1, 4, 3)),
    ((200, 128, 768, 2048, 8, "fp8_w8a8", None), (64, 128, 128, 1, 8, 3)),
    ((4096, 8, 14336, 4096, 2, "fp8_w8a8", None), (128, 128, 128, 16, 8, 3)),
    # bf16/fp16 (dtype None) and fp32: M tile 16/32/64/128 at M <= 32/96/512/more, N tile
    # 64 to M = 64, K tile 128 to M = 64 then 64, GROUP_SIZE_M 16 when M // E > 128,
    # 8 warps above M = 128, 4 stages to M = 32; a block shape without fp8 is ignored
    ((1, 128, 768, 2048, 8, None, None), (16, 64, 128, 1, 4, 4)),
    ((32, 128, 768, 2048, 8, None, None), (16, 64, 128, 1, 4, 4)),
    ((33, 128, 768, 2048, 8, None, None), (32, 64, 128, 1, 4, 3)),
    ((64, 128, 768, 2048, 8, None, None), (32, 64, 128, 1, 4, 3)),
    ((65, 128, 768, 2048, 8, None, None), (32, 128, 64, 1, 4, 3)),
    ((96, 128, 768, 2048, 8, None, None), (32, 128, 64, 1, 4, 3)),
    ((97, 128, 768, 2048, 8, None, None), (64, 128, 64, 1, 4, 3)),
    ((128, 128, 768, 2048, 8, None, None), (64, 128, 64, 1, 4, 3)),
    ((129, 128, 768, 2048, 8, None, None), (64, 128, 64, 1, 8, 3)),
    ((512, 128, 768, 2048, 8, None, None), (64, 128, 64, 1, 8, 3)),
    ((513, 128, 768, 2048, 8, None, None), (128, 128, 64, 1, 8, 3)),
    ((1024, 8, 14336, 4096, 2, None, None), (128, 128, 64, 1, 8, 3)),
    ((1032, 8, 14336, 4096, 2, None, None), (128, 128, 64, 16, 8, 3)),
    ((1, 128, 768, 2048, 8, None, _B), (16, 64, 128, 1, 4, 4)),
    ((40, 6, 40, 24, 2, "float32", None), (32, 64, 128, 1, 4, 3)),
]


@pytest.mark.parametrize("args, want", DEFAULT_CONFIGS)
def test_default_config_is_upstreams(args, want) -> None:
    bm, bn, bk, group_m, warps, stages = want
    assert get_default_config(*args) == {
        "BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": group_m,
        "SPLIT_K": 1, "num_warps": warps, "num_stages": stages}


def test_block_fp8_without_a_file_takes_the_block_default(tmp_path, monkeypatch) -> None:
    """try_get_optimal_moe_config hands dtype and block_shape on to the default, as
    upstream does: block-FP8 experts without a tuned file get the block-FP8 config."""
    monkeypatch.setattr(config, "get_device_name", lambda: "TEST_GPU")
    monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(tmp_path))
    get_moe_configs.cache_clear()
    try:
        w1, w2 = (256, 1024, 2048), (256, 2048, 512)
        for m in (1, 17, 4096):
            assert try_get_optimal_moe_config(w1, w2, 8, "fp8_w8a8", m, [128, 128]) == \
                get_default_config(m, 256, 512, 2048, 8, "fp8_w8a8", [128, 128])
        got = try_get_optimal_moe_config(w1, w2, 8, "fp8_w8a8", 17, [128, 128])
        assert (got["BLOCK_SIZE_N"], got["GROUP_SIZE_M"]) == (128, 32)  # not bf16's
        assert got != try_get_optimal_moe_config(w1, w2, 8, None, 17)
    finally:
        get_moe_configs.cache_clear()


def test_committed_configs_are_valid() -> None:
    """Every shipped file parses and names an int M per kernel config with all keys."""
    keys = {"BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps",
            "num_stages"}
    files = [f for f in os.listdir(config.CONFIG_DIR) if f.endswith(".json")]
    assert files
    for name in files:
        assert name.startswith("E=") and ",N=" in name and ",device_name=" in name
        with open(os.path.join(config.CONFIG_DIR, name)) as f:
            tuned = json.load(f)
        tuned.pop("triton_version", None)
        for m, cfg in tuned.items():
            assert int(m) >= 1 and keys <= set(cfg), (name, m)
            assert cfg["BLOCK_SIZE_M"] >= 16 and cfg["BLOCK_SIZE_K"] >= 16


def test_backend_env(monkeypatch) -> None:
    monkeypatch.setenv("LIBVLLM_MOE_BACKEND", "torch")
    assert FusedMoE(4, 2, 8, 8).backend == "torch"
    monkeypatch.setenv("LIBVLLM_MOE_BACKEND", "cutlass")
    with pytest.raises(InvalidArgumentError, match="LIBVLLM_MOE_BACKEND"):
        FusedMoE(4, 2, 8, 8)


def test_tuning_script_reads_the_model_and_merges_configs(tmp_path, monkeypatch) -> None:
    """examples/bench/benchmark_moe.py: shapes from config.json; tuned sizes over the
    shipped file's others, in upstream's file layout."""
    pytest.importorskip("triton")
    from examples.bench import benchmark_moe as bm

    assert bm.model_params(os.path.join(os.path.dirname(__file__), "..", "examples", "bench",
                                           "models", "qwen3-30b-a3b")) == (128, 8, 768, 2048)
    monkeypatch.setattr(config, "get_device_name", lambda: "NVIDIA_H200")
    new = {k: 1 for k in bm.KEYS}
    bm.save_configs({1: new, 5: new}, 128, 768, tmp_path, None, None)
    written = json.loads((tmp_path / "E=128,N=768,device_name=NVIDIA_H200.json").read_text())
    assert "triton_version" in written and written["1"] == new and written["5"] == new
    assert written["4096"]["BLOCK_SIZE_M"] >= 16  # kept from the shipped file
    # --dtype fp8_w8a8: upstream's block-FP8 name, merged over the shipped block-FP8 file
    bm.save_configs({1: new}, 256, 512, tmp_path, "fp8_w8a8", bm.FP8_BLOCK)
    fp8 = json.loads((tmp_path / "E=256,N=512,device_name=NVIDIA_H200,dtype=fp8_w8a8,"
                                  "block_shape=[128,128].json").read_text())
    assert fp8["1"] == new and len(fp8) > 2
    assert bm.valid({"BLOCK_SIZE_M": 16}, 1, 8, 128)
    assert not bm.valid({"BLOCK_SIZE_M": 64}, 1, 8, 128)


def test_gemv_sweep_descends_to_the_fastest_config_timing_each_once(monkeypatch) -> None:
    """benchmark_moe.py --gemv-sweep's descent on a fake timer: the fastest config within
    the register budget, every config timed once across seeds, failures skipped."""
    pytest.importorskip("triton")
    from examples.bench import benchmark_moe as bm

    timed = []

    def fake_gpu_time(fn):
        cfg = fn.args[0]
        timed.append(cfg)
        if cfg[0] == 16:
            raise RuntimeError("out of resources")
        return abs(cfg[0] - 2) + abs(cfg[1] - 512) / 128 + abs(cfg[2] - 4) + 1.0

    monkeypatch.setattr(bm, "gpu_time", fake_gpu_time)
    timer = bm._timer(lambda cfg: None)
    best, t = bm._descend(timer, (4, 256, 2, 1), 8, float("inf"))
    assert best == (2, 512, 4, 1) and t == 1.0 / bm.ROUTINGS
    again, _ = bm._descend(timer, (1, 1024, 4, 1), 8, float("inf"))
    assert again == best and len(timed) == len(set(timed))
