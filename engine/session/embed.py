"""Embedding inputs to completion (vLLM's LLM.embed, vllm/entrypoints/pooling/offline.py)
for an engine session: one pooling request per input (LLMEngine.add_pooling_request),
through AsyncLLM streams when the background loop runs, else stepped here under the
session's lock (a pooling engine holds only pooling requests, and the lock is held until
the batch is done, so every output of those steps is this call's).
"""

from __future__ import annotations

import secrets

from libvllm.engine.async_llm import AsyncLLM
from libvllm.engine.errors import VllmError
from libvllm.engine.llm_engine import LLMEngine
from libvllm.engine.outputs import PoolingRequestOutput
from libvllm.engine.pooling_params import PoolingParams


def run_caller_driven(engine: LLMEngine, prompts: list, params: PoolingParams
                      ) -> list[PoolingRequestOutput]:
    salt = secrets.token_hex(4)
    ids = [f"embed-{salt}-{i}" for i in range(len(prompts))]
    added: list[str] = []
    done: dict = {}  # request id -> its PoolingRequestOutput
    try:
        for rid, prompt in zip(ids, prompts):
            engine.add_pooling_request(rid, prompt, params)
            added.append(rid)
        wanted = set(ids)  # a step may also return an earlier call's aborted request
        while len(done) < len(ids):
            for out in engine.step():
                if out.request_id in wanted:
                    done[out.request_id] = out
    except BaseException:
        for rid in added:
            if rid not in done:
                try:
                    engine.abort_request(rid)
                except VllmError:
                    pass
        raise
    return [done[rid] for rid in ids]


def run_loop(loop: AsyncLLM, prompts: list, params: PoolingParams
             ) -> list[PoolingRequestOutput]:
    salt = secrets.token_hex(4)
    streams = []
    try:
        for i, prompt in enumerate(prompts):
            streams.append(loop.add_pooling_request(f"embed-{salt}-{i}", prompt, params))
        return [stream.get(None) for stream in streams]
    except BaseException:
        for stream in streams:
            stream.cancel()
        raise


def vectors(outputs: list[PoolingRequestOutput]) -> list:
    """Each output's vector; the error that failed an input, raised."""
    data = []
    for i, result in enumerate(outputs):
        if result.error is not None:
            raise result.error
        if result.outputs is None:
            raise VllmError(f"vllm_embed: input {i} was aborted")
        data.append(result.outputs.data)
    return data
