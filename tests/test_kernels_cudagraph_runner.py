"""The model runner's graph path on CPU: padded FULL and FULL_AND_PIECEWISE (the default:
FULL_DECODE_ONLY's decode graphs plus FULL's mixed ones) steps through the Triton kernels
(interpreter) equal eager steps.

A captured CUDA graph re-executes, at each replay, all the device work its forward did at
capture, with the persistent buffers' current contents and the launch decisions made from
the BatchDescriptor alone. SimulatedGraphs does exactly that on CPU (replay = run the
captured forward again), so the runner's padding (token count up to the bucket, the
padding request row, slot -1, extra request rows), the dispatcher and the unified
attention kernel are checked end to end without a GPU, as vLLM's
tests/v1/cudagraph/test_cudagraph_dispatch.py checks its wrapper with a mocked graph. A
forward that wrote a persistent buffer (the bug this guards against) would overwrite the
step's inputs here too. Scenarios as tests/test_gpu_model_runner.py's mixed-steps test:
chunked prefill at 16 tokens a step, a shared prefix with prefix caching, penalties,
logprobs, prompt logprobs, preemption, async scheduling on and off.
"""

from __future__ import annotations

import pytest
from test_kernels_common import ON_CUDA

from libvllm.engine.compilation_config import CUDAGraphMode
from libvllm.engine.config import EngineConfig
from libvllm.engine.layers import attention as attention_layer
from libvllm.engine.llm_engine import LLMEngine
from libvllm.engine.sampling_params import SamplingParams
from libvllm.engine.worker.cudagraph import CudaGraphs
from tests.test_models_parity import make_hf_model

pytestmark = pytest.mark.skipif(ON_CUDA, reason="CPU simulation (tests/test_gpu_model_runner.py "
                                "runs real graphs)")

PROMPTS = [[(7 * i + 3 * j) % 300 for j in range(n)] for i, n in enumerate((37, 5, 20, 11))]
PARAMS = [SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=2),
          SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True,
                         presence_penalty=0.5, repetition_penalty=1.2),
          SamplingParams(temperature=0.0, max_tokens=7, ignore_eos=True, prompt_logprobs=1),
          SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)]


class SimulatedGraphs(CudaGraphs):
    """Replay = the captured forward run again (what a CUDA graph replay executes)."""

    def capture(self, forward):
        self._forward = forward
        self.replayed = []
        for desc in self.dispatcher.capture_descs():
            self._graphs[desc] = forward(desc)  # the capture run

    def replay(self, desc):
        self.replayed.append(desc)
        return self._forward(desc)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama")
    make_hf_model("llama", max_position_embeddings=512).save_pretrained(d)
    return str(d)


@pytest.fixture(autouse=True)
def kernel_attention(monkeypatch):
    """Attention through the Triton kernels (interpreted) on CPU, as on CUDA."""
    monkeypatch.setattr(attention_layer, "use_kernels", lambda q: True)


def run(path: str, mode: CUDAGraphMode | None, async_scheduling: bool, num_blocks: int,
        max_tokens: int | None):
    """(tokens, logprobs, prompt logprobs, graphs replayed, preemptions)."""
    engine = LLMEngine.from_config(EngineConfig(
        path, device="cpu", dtype="float32", skip_tokenizer_init=True, max_num_seqs=4,
        max_num_batched_tokens=16, max_model_len=128, async_scheduling=async_scheduling,
        kv_cache_memory_bytes=num_blocks * 2 * 2 * 16 * 2 * 16 * 4))  # 2 layers, 2 kv x 16
    replayed, preempted = [], []
    if mode is not None:
        graphs = engine.model_runner.init_cudagraphs(SimulatedGraphs, mode, [1, 2, 4, 8, 16])
        replayed = graphs.replayed
    real_preempt = engine.scheduler._preempt_request
    engine.scheduler._preempt_request = lambda r: preempted.append(r) or real_preempt(r)
    for i, sp in enumerate(PARAMS):
        if max_tokens:
            sp = sp.clone()
            sp.max_tokens = max_tokens
        engine.add_request(str(i), PROMPTS[0][:16] + PROMPTS[i], sp)  # one shared block
    out = {}
    while engine.has_unfinished_requests():
        out.update({o.request_id: o for o in engine.step() if o.finished})
    done = [out[str(i)] for i in range(len(PARAMS))]
    return ([o.outputs[0].token_ids for o in done], [o.outputs[0].logprobs for o in done],
            [o.prompt_logprobs for o in done], replayed, len(preempted))


def _close(a, b):
    for seq_a, seq_b in zip(a, b):
        for pos_a, pos_b in zip(seq_a or [], seq_b or []):
            for tok, lp in (pos_b or {}).items():
                assert tok in pos_a and abs(pos_a[tok].logprob - lp.logprob) < 1e-3


# Each scenario, each scheduling mode and each graph mode once (two interpreted engine runs
# a case: eager, then graphed): the default FULL_AND_PIECEWISE (decode graphs and mixed
# ones) with the shared prefix, FULL (every step a mixed graph, decodes padded) under
# preemption. The other pairs, prefix-cache-async among them, run as real CUDA graphs in
# tests/test_gpu_model_runner.py's test_mixed_steps_under_graphs_equal_eager.
@pytest.mark.parametrize("num_blocks,max_tokens,async_scheduling,mode", [
    (64, None, False, CUDAGraphMode.FULL_AND_PIECEWISE),
    (10, 10, True, CUDAGraphMode.FULL),  # 9 usable blocks, 12 needed: preemption
], ids=["prefix-cache-sync", "preemption-async"])
def test_graphed_steps_equal_eager(llama_dir, num_blocks, max_tokens, async_scheduling, mode,
                                   monkeypatch):
    args = (async_scheduling, num_blocks, max_tokens)
    splits: list[tuple[int, int]] = []  # (num_decodes, max_query_len) a layer call
    attend = attention_layer.Attention._attend_cuda
    monkeypatch.setattr(attention_layer.Attention, "_attend_cuda", lambda self, q, md, g: (
        splits.append((md.num_decodes, md.max_query_len)), attend(self, q, md, g))[1])
    eager = run(llama_dir, None, *args)
    # eager mixed steps split their decode rows off (engine/layers/attention.py)
    assert any(d > 0 and m > 1 for d, m in splits)
    splits.clear()
    got = run(llama_dir, mode, *args)
    assert splits and all(d == 0 for d, _ in splits)  # graph steps: one unified launch
    assert any(not d.uniform and d.num_tokens == 16 for d in got[3])  # prefill chunks
    if mode == CUDAGraphMode.FULL:
        assert any(not d.uniform and d.num_tokens < 8 for d in got[3])  # decodes, padded
    else:  # decode graphs (FULL_DECODE_ONLY's routine) and mixed graphs (FULL's)
        assert {d.uniform for d in got[3]} == {True, False}
    assert (eager[4] > 0) == (max_tokens is not None) == (got[4] > 0)
    assert got[0] == eager[0]
    _close(got[1], eager[1])
    _close(got[2], eager[2])
