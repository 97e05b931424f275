"""The CUDA-graph memory estimate of engine/worker/gpu_worker.py (determine_available_memory)
follows the resolved capture sizes and mode (engine/resolved_config.py), as vLLM 0.33's
gpu_worker.determine_available_memory skips profile_cudagraph_memory for
CUDAGraphMode.NONE and gpu_model_runner.profile_cudagraph_memory sizes the estimate from
the dispatcher's capture descriptors. Runs on CPU: the runner and the device's memory
counters are fakes, so the expected bytes are exact."""

from __future__ import annotations

import contextlib

import pytest
import torch

from libvllm.engine.config import EngineConfig
from libvllm.engine.resolved_config import DeviceFacts, resolve_config
from libvllm.engine.worker import gpu_worker

ACT = 1000  # activation bytes per token of the fake forward (its peak)
HIDDEN = 16  # hidden size of the fake forward's output rows (bfloat16: 32 bytes a row)
ROW = HIDDEN * 2
TOTAL = 10 << 30


class FakeMemory:
    """torch.cuda's counters for a device whose only allocations are the fake forwards."""

    def __init__(self) -> None:
        self.allocated = 1 << 20
        self.peak = self.allocated

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for name in ("synchronize", "empty_cache"):
            monkeypatch.setattr(torch.cuda, name, lambda *a, **k: None)
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats",
                            lambda *a, **k: setattr(self, "peak", self.allocated))
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a, **k: self.peak)
        monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a, **k: self.allocated)
        monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a, **k: self.allocated)
        monkeypatch.setattr(torch.cuda, "mem_get_info",
                            lambda *a, **k: (TOTAL - self.allocated, TOTAL))
        monkeypatch.setattr(gpu_worker, "precompile_triton", contextlib.nullcontext)


class FakeRunner:
    """What determine_available_memory reads of a ModelRunner."""

    def __init__(self, memory: FakeMemory, max_num_reqs: int, max_num_tokens: int) -> None:
        self.memory = memory
        self.device = torch.device("cpu")
        self.model = torch.nn.Linear(1, 1)  # no fused-MoE layers
        self.max_num_reqs, self.max_num_tokens = max_num_reqs, max_num_tokens
        self.memory_profile: dict[str, int] = {}
        self.runs: list[int] = []

    def profile_run(self, num_tokens: int, sample: bool = True) -> torch.Tensor:
        self.runs.append(num_tokens)
        self.memory.peak = max(self.memory.peak, self.memory.allocated + num_tokens * ACT)
        return torch.zeros(num_tokens, HIDDEN, dtype=torch.bfloat16)  # [num_tokens, hidden]


def _profile(monkeypatch, **flags) -> tuple[int, FakeRunner]:
    """(cudagraph_estimate, runner) of the profile for an engine with these flags."""
    resolved = resolve_config(EngineConfig("m", max_num_seqs=4, max_num_batched_tokens=64,
                                           **flags), 4096, DeviceFacts("cpu"))
    memory = FakeMemory()
    memory.install(monkeypatch)
    runner = FakeRunner(memory, 4, 64)
    gpu_worker.determine_available_memory(runner, 64, 0.9,
                                          resolved.compilation.capture_sizes())
    return runner.memory_profile["cudagraph_estimate"], runner


def test_estimate_follows_the_resolved_capture_sizes(monkeypatch):
    """Largest captured forward's peak + every other graph's output row block."""
    full, _ = _profile(monkeypatch, cudagraph_mode="FULL", cudagraph_capture_sizes=[1, 2, 4, 8])
    assert full == 8 * ACT + (4 + 2 + 1) * ROW
    small, runner = _profile(monkeypatch, cudagraph_mode="FULL", cudagraph_capture_sizes=[1, 2])
    assert small == 2 * ACT + 1 * ROW
    assert max(runner.runs[1:]) <= 64  # no forward past the batched-token budget


def test_estimate_follows_the_resolved_mode(monkeypatch):
    """FULL_AND_PIECEWISE adds a uniform-decode graph per size <= max_num_seqs (4);
    FULL_DECODE_ONLY captures those only; NONE / enforce_eager captures nothing."""
    sizes = [1, 2, 4, 8]
    both, _ = _profile(monkeypatch, cudagraph_mode="FULL_AND_PIECEWISE",
                       cudagraph_capture_sizes=sizes)
    assert both == 8 * ACT + (4 + 2 + 1 + 4 + 2 + 1) * ROW
    decode, _ = _profile(monkeypatch, cudagraph_mode="FULL_DECODE_ONLY",
                         cudagraph_capture_sizes=sizes)
    assert decode == 4 * ACT + (2 + 1) * ROW
    for flags in ({"cudagraph_mode": "NONE"}, {"enforce_eager": True}):
        none, runner = _profile(monkeypatch, cudagraph_capture_sizes=sizes, **flags)
        assert none == 0
        assert runner.memory_profile["available"] == (
            int(TOTAL * 0.9) - runner.memory_profile["torch_peak"])


def test_default_ladder_estimate_is_counted(monkeypatch):
    """vLLM's default ladder for max_num_seqs 4 (sizes 1, 2, 4, 8 capped at 2 * 4) in the
    default FULL_AND_PIECEWISE mode: the KV budget is the estimate less than without it."""
    default, runner = _profile(monkeypatch)
    assert default == 8 * ACT + (4 + 2 + 1 + 4 + 2 + 1) * ROW
    profile = runner.memory_profile
    assert profile["available"] == (int(TOTAL * 0.9) - profile["torch_peak"] - default)
