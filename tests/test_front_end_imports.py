"""A front end whose engine core runs in a child process imports no torch
(.agents/specs/torch-free-front-end.md).

With CUDA the core runs in a fresh interpreter (engine/engine_core/engine_core_utils.py); the
front end (tokenizer, input and output processing, the ZMQ client, the model info the C
ABI reports) touches no tensor, so a host that never imports torch pays its import once,
in the child. Oracle: the in-process engine (InprocClient) of this test process for the
same greedy tokens and logprobs. No upstream test: vLLM's front end imports torch; its
platform choice from NVML without torch is vllm/platforms/__init__.py
cuda_platform_plugin, mirrored by engine/platforms.py.
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
from pathlib import Path

import pytest

from libvllm.engine import platforms
from libvllm.engine.config import EngineConfig
from libvllm.engine.engine_core.core_client import use_multiprocessing
from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.llm_engine import LLMEngine
from libvllm.engine.sampling_params import SamplingParams

PROMPTS = {"a": "The capital of France is", "b": "Hello, my name is"}

# A child python runs _front_end with torch unimportable (None in sys.modules).
_CHILD = ("import json, sys; sys.modules['torch'] = None; sys.path.insert(0, sys.argv[2]); "
          "from test_front_end_imports import _front_end; "
          "print(json.dumps(_front_end(*sys.argv[1:2], *sys.argv[3:])))")


def _summaries(engine: LLMEngine) -> dict:
    """Greedy text, ids, finish reason, logprob ids, cumulative logprob, prompt logprobs."""
    sp = SamplingParams(temperature=0, max_tokens=8, logprobs=2, prompt_logprobs=1)
    for rid, prompt in PROMPTS.items():
        engine.add_request(rid, prompt, sp.clone())
    done = {}
    while engine.has_unfinished_requests():
        done.update({o.request_id: o for o in engine.step() if o.finished})
    return {rid: [o.outputs[0].text, o.outputs[0].token_ids, o.outputs[0].finish_reason,
                  [sorted(p) for p in o.outputs[0].logprobs], o.outputs[0].cumulative_logprob,
                  len(o.prompt_logprobs)] for rid, o in done.items()}


def _front_end(model: str, device: str = "cpu") -> dict:
    """In the child: a front end with its core in a child of its own (on "auto", the mode
    NVML chooses)."""
    engine = LLMEngine.from_config(EngineConfig(
        model, device=device, max_model_len=256,
        multiprocessing=True if device == "cpu" else None))
    try:
        ready, info = engine.engine_core.ready, engine.model_info
        return {"multiprocess": engine.is_multiprocess, "torch": sys.modules["torch"],
                "device": ready.device, "dtype": ready.dtype,
                "info": [info.architecture, info.vocab_size, info.eos_token_id],
                "out": _summaries(engine)}
    finally:
        engine.shutdown()


@pytest.mark.slow
def test_child_core_front_end_runs_without_torch(model_path, child_env):
    run = subprocess.run([sys.executable, "-c", _CHILD, model_path, str(Path(__file__).parent)],
                         capture_output=True, text=True, env=child_env, timeout=600)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["multiprocess"] and got["torch"] is None  # still blocked: never imported
    local = LLMEngine.from_config(EngineConfig(model_path, device="cpu", max_model_len=256,
                                               multiprocessing=False))
    try:
        want = _summaries(local)
        assert got["device"] == local.engine_core.ready.device == "cpu"
        assert got["dtype"] == local.engine_core.ready.dtype == "float32"
        info = local.model_info
        assert got["info"] == [info.architecture, info.vocab_size, info.eos_token_id]
    finally:
        local.shutdown()
    for rid in PROMPTS:
        g, w = got["out"][rid], want[rid]
        assert g[:4] == w[:4]
        assert g[4] == pytest.approx(w[4], abs=1e-4)
        assert g[5] == w[5] > 0


@pytest.mark.gpu
def test_cuda_front_end_chooses_a_child_core_without_torch(model_path, child_env):
    """On a GPU machine the default mode comes from NVML, in a front end without torch;
    the child core runs on CUDA in bf16."""
    if not platforms.cuda_platform_available():  # here, not at import: _CHILD imports us
        pytest.skip("needs a CUDA device")
    env = {k: v for k, v in child_env.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    run = subprocess.run([sys.executable, "-c", _CHILD, model_path, str(Path(__file__).parent),
                          "auto"], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["multiprocess"] and got["torch"] is None
    assert (got["device"], got["dtype"]) == ("cuda", "bfloat16")
    assert all(out[2] in ("stop", "length") and out[5] > 0 for out in got["out"].values())


@pytest.mark.parametrize("multiprocessing,env,device,cuda,want", [
    (True, "0", "cpu", False, True),  # the config wins
    (False, "1", "cuda", True, False),
    (None, "1", "cpu", False, True),  # then the environment
    (None, "0", "cuda", True, False),
    (None, "", "cpu", True, False),  # then the device
    (None, "", "cuda", False, True),
    (None, "", "auto", True, True),
    (None, "", "auto", False, False),
])
def test_use_multiprocessing(monkeypatch, multiprocessing, env, device, cuda, want):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", env)
    monkeypatch.setattr(platforms, "cuda_platform_available", lambda: cuda)
    config = EngineConfig("m", device=device, multiprocessing=multiprocessing)
    assert use_multiprocessing(config) is want


def test_use_multiprocessing_refuses_a_bad_environment_value(monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "yes")
    with pytest.raises(InvalidArgumentError, match="must be 0 or 1"):
        use_multiprocessing(EngineConfig("m"))


class _FakeNVML:
    """libnvidia-ml's two calls: nvmlInit_v2 (status) and nvmlDeviceGetCount_v2."""

    def __init__(self, init_status: int, count: int) -> None:
        self.init_status, self.count, self.shutdowns = init_status, count, 0
        self.nvmlInit_v2 = lambda: self.init_status
        self.nvmlShutdown = self._shutdown

    def _shutdown(self) -> int:
        self.shutdowns += 1
        return 0

    def nvmlDeviceGetCount_v2(self, count_ref) -> int:
        ctypes.cast(count_ref, ctypes.POINTER(ctypes.c_uint)).contents.value = self.count
        return 0


@pytest.mark.parametrize("init_status,count,want", [(0, 2, True), (0, 0, False),
                                                    (9, 2, False)])
def test_cuda_platform_from_nvml(monkeypatch, init_status, count, want):
    nvml = _FakeNVML(init_status, count)
    monkeypatch.setattr(platforms, "_load_nvml", lambda: nvml)
    assert platforms.cuda_platform_available() is want
    assert nvml.shutdowns == (init_status == 0)


@pytest.mark.parametrize("cuda", [False, True])
def test_without_nvml_torch_answers(monkeypatch, cuda):
    import torch

    def missing(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", missing)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    assert platforms.cuda_platform_available() is cuda


def test_cuda_requested_without_cuda_is_refused_by_the_core(model_path):
    """The front end no longer checks the device: the core's refusal reaches the caller
    through the start-up handshake (status and message), from a child core too."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here: the refusal needs a machine without it")
    for multiprocessing in (True, False):
        with pytest.raises(InvalidArgumentError, match="device 'cuda' requested but CUDA"):
            LLMEngine.from_config(EngineConfig(model_path, device="cuda", max_model_len=256,
                                               multiprocessing=multiprocessing))
