"""Per-request stream_interval (vllm/sampling_params.py; vllm/v1/engine/output_processor.py
RequestState.make_request_output): DELTA outputs come every stream_interval new tokens,
the first token and the finish at once; the text and tokens do not change.

Mirrors vLLM 0.33 tests/v1/engine/test_output_processor.py::test_incremental_detokenization
(stream_interval 1 / 5 / 10 with DELTA and FINAL_ONLY; one token a step from a mock core;
oracle: the generation's own tokens and their detokenization with stream_interval 1) and
SamplingParams._verify_args's message; the OpenAI field through the server layer. The
engine-level --stream-interval (the floor a request cannot go below) is not built: its
default, 1, is what runs.
"""

from __future__ import annotations

import json

import pytest

from libvllm.engine.async_llm import AsyncLLM
from libvllm.engine.config import EngineConfig
from libvllm.engine.entrypoints.openai.api import handle_openai_request
from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.gguf.reader import GGUFReader
from libvllm.engine.llm_engine import LLMEngine
from libvllm.engine.output_processor import OutputProcessor
from libvllm.engine.request import Request, RequestStatus
from libvllm.engine.sampling_params import RequestOutputKind, SamplingParams
from libvllm.engine.tokenizer import Tokenizer
from tests.test_parallel_sampling import _core_out

TEXTS = ["The quick brown fox jumps over the lazy dog, again and again, until dusk.",
         "Paris is the capital of France; Berlin is the capital of Germany."]


@pytest.fixture(scope="module")
def tokenizer(model_path):
    with GGUFReader(model_path) as r:
        return Tokenizer.from_gguf_metadata(r.metadata)


def _run(tokenizer, kind: RequestOutputKind, stream_interval: int | None) -> dict:
    """Feed each text's tokens one a step; {request id: [(text, token ids, finished)]}."""
    op = OutputProcessor(tokenizer)
    reqs = []
    for i in range(len(TEXTS)):
        sp = SamplingParams(output_kind=kind, stream_interval=stream_interval, max_tokens=64)
        reqs.append(Request(f"r{i}", tokenizer.encode("Hello"), sp, None, 0.0, 16))
        op.add_request(reqs[-1], "Hello")
    gens = [tokenizer.encode(text, add_special_tokens=False) for text in TEXTS]
    got: dict = {r.request_id: [] for r in reqs}
    for step in range(max(map(len, gens))):
        outs = []
        for req, gen in zip(reqs, gens, strict=True):
            if step < len(gen):
                req.append_output_token_ids([gen[step]])
                if step == len(gen) - 1:
                    req.status = RequestStatus.FINISHED_LENGTH_CAPPED
                outs.append(_core_out(req, [gen[step]]))
        for out in op.process_outputs(outs)[0]:
            c = out.outputs[0]
            got[out.request_id].append((c.text, list(c.token_ids), out.finished))
    assert not op.has_unfinished_requests()
    return got


@pytest.mark.parametrize("kind", [RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY])
@pytest.mark.parametrize("stream_interval", [1, 5, 10])
def test_incremental_detokenization(tokenizer, kind, stream_interval):
    want = _run(tokenizer, RequestOutputKind.DELTA, None)
    got = _run(tokenizer, kind, stream_interval)
    for rid, outs in got.items():
        assert "".join(t for t, _, _ in outs) == "".join(t for t, _, _ in want[rid])
        assert sum((ids for _, ids, _ in outs), []) == sum((ids for _, ids, _ in want[rid]), [])
        assert outs[-1][2] and not any(done for _, _, done in outs[:-1])
        if kind == RequestOutputKind.FINAL_ONLY:
            assert len(outs) == 1
            continue
        assert len(outs[0][1]) == 1  # the first token at once
        assert all(len(ids) == stream_interval for _, ids, _ in outs[1:-1])
        assert 1 <= len(outs[-1][1]) <= stream_interval


def test_cumulative_outputs_are_not_grouped(tokenizer):
    """vLLM advances its sent-tokens offset in DELTA mode only, so a CUMULATIVE request
    with a stream_interval still gets an output every step."""
    got = _run(tokenizer, RequestOutputKind.CUMULATIVE, 4)
    for rid, outs in got.items():
        n = len(tokenizer.encode(TEXTS[int(rid[1])], add_special_tokens=False))
        assert [len(ids) for _, ids, _ in outs] == list(range(1, n + 1))


@pytest.mark.parametrize("value", [0, -3])
def test_stream_interval_below_one_is_refused(value):
    with pytest.raises(InvalidArgumentError,
                       match=f"stream_interval must be at least 1, got {value}."):
        SamplingParams(stream_interval=value)


def test_openai_stream_interval_groups_the_chunks(model_path):
    engine = LLMEngine.from_config(EngineConfig(model=model_path, device="cpu",
                                                max_model_len=256, max_num_seqs=2))
    llm = AsyncLLM(engine)
    try:
        body = {"prompt": "Once upon a time", "max_tokens": 9, "temperature": 0,
                "ignore_eos": True, "stream": True, "logprobs": 0, "stream_interval": 4}
        res = handle_openai_request(llm, "POST", "/v1/completions", json.dumps(body),
                                    served_model_name="m")
        assert res.status == 200, res.body
        sizes = []
        while (chunk := res.stream.get(60)) not in ("", None):
            choice = json.loads(chunk)["choices"][0]
            sizes.append(len(choice["logprobs"]["tokens"]))
        # chunk ends fall on the interval (a reader that lags gets neighbours merged, as
        # vLLM's RequestOutputCollector merges them)
        ends = [sum(sizes[:i + 1]) for i in range(len(sizes))]
        assert set(ends) <= {1, 5, 9} and ends[-1] == 9
    finally:
        llm.shutdown()
