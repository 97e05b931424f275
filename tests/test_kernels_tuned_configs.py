"""kernels/tuned_configs.py (the tuned JSON loader) and kernels/launch_configs.py (the records).

The behaviour is vLLM 0.33's config lookup
(vllm/model_executor/layers/fused_moe/fused_moe.py get_config_file_name / get_moe_configs /
try_get_optimal_moe_config, vllm/model_executor/layers/quantization/utils/fp8_utils.py
get_w8a8_block_fp8_configs, vllm/utils/platform_utils.py get_device_name_as_file_name):
the device's file by name, the nearest batch size, the default without a file; a malformed
file is our addition (vLLM raises whatever json or the kernel raises), an error naming the
file. Every shipped file must parse into its kernel's record.
"""

from __future__ import annotations

import json
import logging
import os
import re

import pytest
import torch

from libvllm.engine.errors import InvalidArgumentError
from libvllm.kernels import fp8_block_gemm, tuned_configs
from libvllm.kernels.launch_configs import GemmConfig, GemvConfig, MmvqConfig
from libvllm.kernels.tuned_configs import (
    CONFIG_ROOT,
    config_file_name,
    device_name,
    find_configs,
    nearest,
    read_config_file,
)

GEMM = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
        "num_warps": 4, "num_stages": 3}
# kernels/configs/<kernel>/ -> the record its files hold
RECORDS = {"fused_moe": GemmConfig, "fp8_block": GemmConfig}


@pytest.fixture
def fp8_dir(tmp_path, monkeypatch):
    """kernels/fp8_block_gemm.py reading its files from tmp_path, its cache cleared."""
    monkeypatch.setattr(fp8_block_gemm, "CONFIG_DIR", str(tmp_path))
    fp8_block_gemm.get_w8a8_block_fp8_configs.cache_clear()
    yield tmp_path
    fp8_block_gemm.get_w8a8_block_fp8_configs.cache_clear()


@pytest.mark.parametrize("cuda_name,want", [
    ("NVIDIA H100 80GB HBM3", "NVIDIA_H100_80GB_HBM3"),
    ("NVIDIA H200", "NVIDIA_H200"),
    ("NVIDIA H200 NVL", "NVIDIA_H200"),  # every H200 variant reads the H200's files
    ("Some  GPU/rev 2", "Some_GPU_rev_2"),  # runs of whitespace and "/" become one "_"
])
def test_device_name_as_file_name(monkeypatch, cuda_name: str, want: str) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: cuda_name)
    assert device_name() == want


def test_file_names_are_vllms() -> None:
    assert config_file_name({"E": 128, "N": 768}, "NVIDIA_H200") == \
        "E=128,N=768,device_name=NVIDIA_H200.json"
    assert config_file_name({"N": 4096, "K": 14336}, "NVIDIA_H100_80GB_HBM3", "fp8_w8a8",
                            [128, 128]) == ("N=4096,K=14336,device_name=NVIDIA_H100_80GB_HBM3,"
                                            "dtype=fp8_w8a8,block_shape=[128,128].json")
    # a block shape holding a 0 is none (vLLM's `all(block_shape)`)
    assert config_file_name({"E": 8, "N": 64}, "X", None, [0, 0]) == "E=8,N=64,device_name=X.json"


def test_the_devices_own_file_is_read(fp8_dir, monkeypatch) -> None:
    """An H100 reads the H100 file; an H200 without one takes the default rule."""
    h100 = dict(GEMM, BLOCK_SIZE_N=32)
    (fp8_dir / fp8_block_gemm.get_config_file_name(
        256, 512, 128, 128, "NVIDIA_H100_80GB_HBM3")).write_text(json.dumps({"1": h100}))
    monkeypatch.setattr(fp8_block_gemm, "device_name", lambda: "NVIDIA_H100_80GB_HBM3")
    assert fp8_block_gemm.get_config(7, 256, 512, 128, 128) == GemmConfig(**h100)
    fp8_block_gemm.get_w8a8_block_fp8_configs.cache_clear()
    monkeypatch.setattr(fp8_block_gemm, "device_name", lambda: "NVIDIA_H200")
    assert fp8_block_gemm.get_config(7, 256, 512, 128, 128) == \
        fp8_block_gemm.default_config(128, 128)


def test_nearest_batch_size_first_of_equals() -> None:
    configs = {1: "a", 16: "b", 64: "c", 3: "d"}  # file order, not sorted
    picks = {m: nearest(configs, m) for m in (1, 2, 8, 10, 40, 41, 5000)}
    # 2 is 1 from both 1 and 3, 40 is 24 from 16 and 64: the first in file order (vLLM's
    # min over the keys)
    assert picks == {1: "a", 2: "a", 8: "d", 10: "b", 40: "b", 41: "c", 5000: "c"}


def test_missing_file_falls_back_to_the_rule(fp8_dir, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="libvllm.kernels.tuned_configs"):
        assert fp8_block_gemm.get_w8a8_block_fp8_configs(64, 64, 32, 32) is None
        assert fp8_block_gemm.get_config(5, 64, 64, 32, 32) == \
            fp8_block_gemm.default_config(32, 32)
    path = os.path.join(fp8_dir, fp8_block_gemm.get_config_file_name(64, 64, 32, 32))
    assert "Using default W8A8 Block FP8 kernel config" in caplog.text and path in caplog.text


def test_found_file_is_read_and_logged(tmp_path, caplog) -> None:
    (tmp_path / "E=2,N=8,device_name=X.json").write_text(
        json.dumps({"triton_version": "3.6.0", "4": GEMM, "1": dict(GEMM, SPLIT_K=1),
                    "8": dict(GEMM, num_ctas=1)}))  # num_ctas: in some of vLLM's files
    with caplog.at_level(logging.INFO, logger="libvllm.kernels.tuned_configs"):
        got = find_configs("E=2,N=8,device_name=X.json", [str(tmp_path / "none"),
                                                          str(tmp_path)],
                           GemmConfig, "MoE layer", "MoE")
    assert list(got) == [4, 1, 8]  # file order; triton_version dropped
    assert got[4].kwargs() == GEMM and got[1].kwargs() == dict(GEMM, SPLIT_K=1)
    assert got[8].kwargs() == dict(GEMM, num_ctas=1)
    assert "for MoE layer." in caplog.text


@pytest.mark.parametrize("text,message", [
    ("{not json", "Expecting property name"),
    ("[1, 2]", "must be a JSON object of batch size -> config"),
    ("{}", "holds no config"),
    (json.dumps({"M1": GEMM}), "key 'M1' is not a batch size"),
    (json.dumps({"0": GEMM}), "key '0' is not a batch size"),
    (json.dumps({"1": [16, 64]}), "M=1: a config must be a JSON object"),
    (json.dumps({"1": {k: v for k, v in GEMM.items() if k != "num_warps"}}),
     r"missing \['num_warps'\]"),
    (json.dumps({"1": dict(GEMM, kpack=2)}), r"unknown \['kpack'\]"),
    (json.dumps({"1": dict(GEMM, BLOCK_SIZE_N=48)}), "BLOCK_SIZE_N must be a power of two"),
    (json.dumps({"1": dict(GEMM, num_stages=0)}), "num_stages must be an int >= 1"),
    (json.dumps({"1": dict(GEMM, num_warps=4.0)}), "num_warps must be an int >= 1"),
    (json.dumps({"1": dict(GEMM, GROUP_SIZE_M=True)}), "GROUP_SIZE_M must be an int >= 1"),
])
def test_malformed_file_names_the_file(fp8_dir, text: str, message: str) -> None:
    path = fp8_dir / fp8_block_gemm.get_config_file_name(64, 64, 32, 32)
    path.write_text(text)
    with pytest.raises(InvalidArgumentError, match=message) as e:
        fp8_block_gemm.get_config(1, 64, 64, 32, 32)
    assert str(path) in str(e.value)


def test_records_validate_their_fields() -> None:
    assert GemvConfig(8, 512, 4, 2).block_k == 512
    with pytest.raises(ValueError, match="block_n must be a power of two"):
        GemvConfig(6, 512, 4, 2)
    assert MmvqConfig(1, 32, 1).layout == 0  # layout 0 allowed
    with pytest.raises(ValueError, match="layout must be 0, 1 or 2"):
        MmvqConfig(1, 32, 1, 3)
    assert GemmConfig(**GEMM).kwargs() == GEMM  # SPLIT_K None: not a launch keyword


def test_every_shipped_file_parses_into_its_record() -> None:
    """kernels/configs/<kernel>/*.json: vLLM's file name and a valid record per batch size
    (read_config_file checks ints >= 1 and power-of-two tiles and warps)."""
    kernels = sorted(os.listdir(CONFIG_ROOT))
    assert set(kernels) <= set(RECORDS), kernels  # a new kernel's files need its record
    name_re = re.compile(r"^([A-Z]+=\d+,)+device_name=[A-Za-z0-9_.-]+"
                         r"(,dtype=\w+)?(,block_shape=\[\d+,\d+\])?\.json$")
    files = [(k, f) for k in kernels for f in os.listdir(os.path.join(CONFIG_ROOT, k))]
    assert files
    for kernel, name in files:
        assert name_re.match(name), name
        configs = read_config_file(os.path.join(CONFIG_ROOT, kernel, name), RECORDS[kernel])
        assert all(m >= 1 for m in configs), name
        for cfg in configs.values():
            assert cfg.BLOCK_SIZE_M >= 16 and cfg.BLOCK_SIZE_K >= 16, (name, cfg)


def test_fp8_tuner_writes_what_the_loader_reads(fp8_dir) -> None:
    """examples/bench/tune_fp8_block.py save: the file get_w8a8_block_fp8_configs reads,
    same name and format."""
    pytest.importorskip("triton")
    from examples.bench import tune_fp8_block

    tuned = {16: dict(GEMM), 1: dict(GEMM, BLOCK_SIZE_M=32)}
    tune_fp8_block.save(256, 512, tuned, [fp8_dir])
    got = fp8_block_gemm.get_w8a8_block_fp8_configs(256, 512, *tune_fp8_block.BLOCK)
    assert got == {m: GemmConfig(**cfg) for m, cfg in tuned.items()}
    assert tuned_configs.device_name() in os.listdir(fp8_dir)[0]
