"""Tensor parallelism on CPU with gloo (engine/distributed, engine/layers, engine/executor).

Oracle: the same engine at tensor_parallel_size 1, fp32, greedy: TP=2 must give the same
tokens (vLLM's tests/distributed/test_pipeline_parallel.py / test_basic_correctness
compare TP runs against a single-device run the same way). Configs: tiny Llama (kv heads
replicated: 1 kv head on 2 ranks), Qwen2 (q/k/v bias), Qwen3, Qwen3-MoE and Mixtral
(experts sharded as vLLM's TP MoE), Gemma 3 (tied, soft-capped LM head) and a Q8_0 GGUF
file (dequantized, then sharded).
The external_launcher backend (vLLM's torchrun mode) on two plain processes.
Failure path as tests/v1/shutdown/test_forward_error.py: a worker killed mid-request gives
every stream an error event, no hang.
Rank 0 runs in the caller's process whatever process groups it made before: engines one
after another, after a start-up that failed and after plain torch.distributed groups (torch
prefixes a group's store keys with a name from a process-wide counter, which a failed
init_process_group advanced, and the next engine's rendezvous waited out its timeout); a
live default group is refused with a clear error (vLLM starts every rank in a fresh process,
vllm/v1/executor/multiproc_executor.py, each engine with its own distributed_init_method).
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import gguf
import pytest
import torch

from libvllm.engine.async_llm import AsyncLLM
from libvllm.engine.config import EngineConfig
from libvllm.engine.errors import InvalidArgumentError, VllmError
from libvllm.engine.exceptions import EngineDeadError
from libvllm.engine.executor.multiproc_executor import get_distributed_init_method, get_open_port
from libvllm.engine.llm_engine import LLMEngine
from libvllm.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.slow
MAX_TOKENS = 12


def _parity():
    """tests.test_models_parity (make_hf_model, make_prompts, write_gguf_twin), imported on
    first use: it imports transformers, which the launched ranks of
    test_external_launcher_ranks_equal_tp1 (they import this module for _generate) need not
    load."""
    import tests.test_models_parity as parity
    return parity


def _engine(path: str, tp: int, mp: bool = False, **kw) -> LLMEngine:
    return LLMEngine.from_config(EngineConfig(path, **{
        "device": "cpu", "dtype": "float32", "max_model_len": 128, "max_num_seqs": 4,
        "skip_tokenizer_init": True, "multiprocessing": mp, "tensor_parallel_size": tp,
        "n_threads": 1, **kw}))


def _generate(path: str, tp: int, prompts: list[list[int]], temperature: float = 0.0,
            **kw) -> list[list[int]]:
    engine = _engine(path, tp, **kw)
    torch.manual_seed(0)  # what a TP engine does after start-up on every rank
    try:
        model = engine.engine_core.engine_core.model_runner.model  # rank 0's shard
        qkv = model.model.layers[0].self_attn.qkv_proj
        assert qkv.num_heads == 4 // tp and qkv.weight.shape[1] == 64
        assert model.model.embed_tokens.weight.shape[0] == 300 // tp
        for i, ids in enumerate(prompts):
            engine.add_request(str(i), ids, SamplingParams(temperature=temperature,
                                                           max_tokens=MAX_TOKENS))
        done = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    done[out.request_id] = out.outputs[0].token_ids
        return [done[str(i)] for i in range(len(prompts))]
    finally:
        engine.shutdown()


@functools.cache
def _tp1_greedy(path: str, prompts: str) -> list[list[int]]:
    """The TP=1 oracle, computed once a model and prompts (json) for the tests that share
    the model: the same engine on the same requests gives the same greedy tokens."""
    return _generate(path, 1, json.loads(prompts))


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory) -> str:
    """make_hf_model("qwen3") (seeded: the same weights each call) saved once for the module;
    no test writes to it."""
    path = tmp_path_factory.mktemp("qwen3")
    _parity().make_hf_model("qwen3").save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3", "qwen3_moe", "mixtral",
                                        "gemma3", "gguf"])
def model_dir(request, tmp_path_factory):
    name = request.param
    if name == "qwen3":
        return request.getfixturevalue("qwen3_dir")
    path = tmp_path_factory.mktemp(name)
    if name == "gguf":
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(gguf.GGUFWriter, "add_tensor", _add_q8_0(gguf.GGUFWriter.add_tensor))
            _parity().write_gguf_twin(_parity().make_hf_model("llama"), "llama", path / "tiny.gguf")
        return str(path / "tiny.gguf")
    overrides = {"num_key_value_heads": 1} if name == "llama" else {}  # kv replication
    _parity().make_hf_model(name, **overrides).save_pretrained(path)
    return str(path)


def _add_q8_0(add_tensor):
    """GGUFWriter.add_tensor storing matrices as Q8_0 blocks (32 values per block)."""
    def add(self, name, array, *args, **kw):
        if array.ndim == 2 and array.shape[1] % 32 == 0:
            q8 = gguf.GGMLQuantizationType.Q8_0
            return add_tensor(self, name, gguf.quants.quantize(array, q8), raw_dtype=q8)
        return add_tensor(self, name, array, *args, **kw)
    return add


def test_tp2_greedy_tokens_equal_tp1(model_dir):
    prompts = _parity().make_prompts(300)
    want = _tp1_greedy(model_dir, json.dumps(prompts))
    got = _generate(model_dir, 2, prompts)
    assert got == want and all(len(t) == MAX_TOKENS for t in got)
    assert not torch.distributed.is_initialized()  # the engine left the group


def test_tp2_random_sampling_equals_tp1(qwen3_dir):
    """Unseeded sampling: the worker draws what rank 0 draws, so its next inputs (its own
    sampled tokens) match rank 0's; a mismatch would corrupt its KV shard, then rank 0's
    logits."""
    prompts = _parity().make_prompts(300)
    want = _generate(qwen3_dir, 1, prompts, temperature=1.0)
    assert _generate(qwen3_dir, 2, prompts, temperature=1.0) == want


def test_engines_after_a_failed_start_equal_tp1(qwen3_dir, monkeypatch):
    monkeypatch.setenv("LIBVLLM_DIST_TIMEOUT_S", "60")  # a rendezvous that never meets
    prompts = _parity().make_prompts(300)
    want = _tp1_greedy(qwen3_dir, json.dumps(prompts))
    with monkeypatch.context() as m:
        m.setenv("LIBVLLM_PYTHON", "/bin/false")  # the worker exits at once
        with pytest.raises(VllmError, match="tensor parallel start-up failed"):
            _engine(qwen3_dir, 2)
    assert _generate(qwen3_dir, 2, prompts) == want
    assert _generate(qwen3_dir, 2, prompts) == want  # a second engine after the first


def test_engine_after_plain_process_groups_equals_tp1(qwen3_dir, monkeypatch):
    monkeypatch.setenv("LIBVLLM_DIST_TIMEOUT_S", "60")
    prompts = _parity().make_prompts(300)
    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(),
                                         world_size=1, rank=0)
    try:
        torch.distributed.new_group([0])
        with pytest.raises(VllmError, match="already has one"):  # its workers could not join
            _engine(qwen3_dir, 2)
    finally:
        torch.distributed.destroy_process_group()
    with pytest.raises(torch.distributed.DistError):  # no peer comes: the rendezvous times out
        torch.distributed.init_process_group(
            "gloo", init_method=get_distributed_init_method("127.0.0.1", get_open_port()),
            world_size=2, rank=0, timeout=timedelta(seconds=1))
    assert _generate(qwen3_dir, 2, prompts) == _tp1_greedy(qwen3_dir, json.dumps(prompts))
    assert not torch.distributed.is_initialized()


_LAUNCHED_RANK = """
import json, sys
from tests.test_tensor_parallel import _generate
print(json.dumps(_generate(sys.argv[1], 2, json.loads(sys.argv[2]),
                         distributed_executor_backend="external_launcher")))
"""


def test_external_launcher_ranks_equal_tp1(qwen3_dir):
    """Every rank started by the launcher (here: two plain processes with torchrun's
    variables) runs its own engine on the same requests and gets the TP=1 tokens."""
    prompts = _parity().make_prompts(300)
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(get_open_port()), "PYTHONPATH": os.getcwd()}
    procs = [subprocess.Popen([sys.executable, "-c", _LAUNCHED_RANK, qwen3_dir,
                               json.dumps(prompts)], env={**env, "RANK": str(r)},
                              stdout=subprocess.PIPE) for r in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    want = _tp1_greedy(qwen3_dir, json.dumps(prompts))
    assert [json.loads(o.decode().splitlines()[-1]) for o in outs] == [want, want]


def test_indivisible_heads_are_refused(qwen3_dir):  # 4 heads
    with pytest.raises(InvalidArgumentError, match="tensor_parallel_size 3"):
        _engine(qwen3_dir, 3)
    with pytest.raises(InvalidArgumentError, match="tensor_parallel_size"):
        EngineConfig(qwen3_dir, tensor_parallel_size=0)


def test_worker_that_cannot_start_fails_engine_creation(qwen3_dir, monkeypatch):
    monkeypatch.setenv("LIBVLLM_PYTHON", "/bin/false")  # the workers' interpreter
    start = time.monotonic()
    with pytest.raises(VllmError, match="tensor parallel start-up failed.*exit code 1"):
        _engine(qwen3_dir, 2)
    assert time.monotonic() - start < 30 and not torch.distributed.is_initialized()


def test_killed_worker_ends_every_stream(tmp_path):
    # 4,000 tokens a stream: generation must outlast the kill (with 100, a loaded CI machine
    # delivered the first output after the engine had finished every stream)
    _parity().make_hf_model("qwen3", max_position_embeddings=4096).save_pretrained(tmp_path)
    engine = _engine(str(tmp_path), 2, mp=True, max_model_len=4096)
    loop = AsyncLLM(engine)
    try:
        worker_pid = _tp_worker_pid(engine.engine_core.core.proc.pid)
        streams = [loop.add_request(f"s{i}", list(range(1, 9)),
                                    SamplingParams(max_tokens=4000, ignore_eos=True))
                   for i in range(3)]
        assert streams[0].get(60) is not None  # generation is under way
        os.kill(worker_pid, signal.SIGKILL)
        killed = time.monotonic()
        for stream in streams:
            with pytest.raises(EngineDeadError):
                while stream.get(30) is not None:
                    pass
        assert time.monotonic() - killed < 30
    finally:
        loop.shutdown()
        engine.shutdown()


def _tp_worker_pid(core_pid: int) -> int:
    """The rank-1 worker: the engine-core child's child running multiproc_worker."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().split(")")[-1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if ppid == core_pid and b"multiproc_worker" in cmd:
            return int(pid)
    raise AssertionError("no tensor-parallel worker found")


def test_row_parallel_shard_with_quantized_gguf_blocks_uses_them() -> None:
    """On CUDA a GGUF shard keeps its blocks (gguf_weight) and has no dense weight: the
    row-parallel forward at tp > 1 multiplies with the blocks, then adds the bias on rank 0
    (it used to call dense_linear on the missing weight)."""
    from libvllm.engine.layers.linear import RowParallelLinear

    layer = RowParallelLinear(8, 4, bias=True, reduce_results=False)
    layer.tp_size, layer.tp_rank = 2, 0  # a rank-0 shard, no process group needed
    with torch.no_grad():
        layer.bias.copy_(torch.arange(4.0))
    layer.weight = None
    layer.gguf_weight = lambda x: x[:, :4] * 2  # stands in for the quantized GEMV
    x = torch.ones(3, 8)
    assert torch.equal(layer(x), torch.full((3, 4), 2.0) + torch.arange(4.0))


def test_monitor_calls_the_failure_callback_with_the_reason():
    """vLLM's register_failure_callback: the monitor thread reports a worker that exits
    outside shutdown (the engine-core child ends itself with it if its loop is stuck)."""
    from libvllm.engine.executor.multiproc_executor import MultiprocExecutor

    executor = MultiprocExecutor.__new__(MultiprocExecutor)  # no process group: monitor only
    worker = subprocess.Popen([sys.executable, "-c", "import os; os.kill(os.getpid(), 9)"])
    worker.wait()
    executor.workers, executor._closing, executor.dead_reason = [worker], False, None
    reasons: list[str] = []
    executor.register_failure_callback(reasons.append)
    executor._monitor_workers()
    assert reasons == [executor.dead_reason] and reasons[0] == (
        f"tensor-parallel worker pid {worker.pid} died (killed by signal SIGKILL)")
