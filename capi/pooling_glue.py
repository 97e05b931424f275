"""capi.pooling_glue: vllm_embed (since ABI 1.3), vLLM's LLM.embed
(vllm/entrypoints/pooling/offline.py) for C callers.

One pooling request per input (LLMEngine.add_pooling_request): with the background loop
through AsyncLLM streams, else stepped here under the engine's lock (a pooling engine
holds only pooling requests, and the lock is held until the batch is done, so every
output of those steps is this call's). Two-call sizing: the vector size is known before
anything runs (the hidden size, or `dimensions`), so a sizing call runs no model.
"""

from __future__ import annotations

import secrets

from _libvllm import ffi

from capi.plumbing import BufferTooSmallError, engines, export
from engine.errors import InvalidArgumentError, UnsupportedError, VllmError
from engine.llm_engine import EMBED_ON_GENERATE
from engine.pooling_params import PoolingParams


def _inputs(texts, text_lens, token_ids, n_token_ids, n_inputs: int) -> list[str | list[int]]:
    if (texts == ffi.NULL) == (token_ids == ffi.NULL):
        raise InvalidArgumentError("vllm_embed: exactly one of texts and token_ids must be "
                                   "non-NULL")
    if n_inputs == 0:
        raise InvalidArgumentError("vllm_embed: n_inputs must be > 0")
    prompts: list[str | list[int]] = []
    for i in range(n_inputs):
        if texts != ffi.NULL:
            if texts[i] == ffi.NULL:
                raise InvalidArgumentError(f"vllm_embed: texts[{i}] is NULL")
            data = ffi.string(texts[i]) if text_lens == ffi.NULL \
                else ffi.unpack(texts[i], text_lens[i])
            try:
                prompts.append(data.decode("utf-8"))
            except UnicodeDecodeError as e:
                raise InvalidArgumentError(f"vllm_embed: texts[{i}] is not valid UTF-8: "
                                           f"{e}") from None
        else:
            if n_token_ids == ffi.NULL:
                raise InvalidArgumentError("vllm_embed: n_token_ids is NULL")
            n = n_token_ids[i]
            if n and token_ids[i] == ffi.NULL:
                raise InvalidArgumentError(f"vllm_embed: token_ids[{i}] is NULL")
            prompts.append(list(ffi.unpack(token_ids[i], n)) if n else [])
    return prompts


def _run_caller_driven(engine, prompts: list, params: PoolingParams) -> list:
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


def _run_loop(loop, prompts: list, params: PoolingParams) -> list:
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


@export
def glue_embed(key, texts, text_lens, token_ids, n_token_ids, n_inputs, dimensions, out,
               capacity, n_floats, dim) -> None:
    record = engines.get_live(key)
    engine = record.engine
    if engine.runner_type != "pooling":
        raise UnsupportedError(EMBED_ON_GENERATE)
    prompts = _inputs(texts, text_lens, token_ids, n_token_ids, n_inputs)
    params = PoolingParams(dimensions=dimensions or None, task="embed")
    size = engine.verify_pooling_params(params).dimensions or engine.hidden_size
    dim[0], n_floats[0] = size, size * n_inputs
    if capacity < size * n_inputs:
        raise BufferTooSmallError(f"{n_inputs} vectors of {size} floats do not fit in "
                                  f"capacity {capacity}")
    if record.loop is not None:
        outputs = _run_loop(record.loop, prompts, params)
    else:
        with record.lock:
            outputs = _run_caller_driven(engine, prompts, params)
    for i, result in enumerate(outputs):
        if result.error is not None:
            raise result.error
        if result.outputs is None:
            raise VllmError(f"vllm_embed: input {i} was aborted")
        out[i * size:(i + 1) * size] = result.outputs.data
