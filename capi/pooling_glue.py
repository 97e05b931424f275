"""capi.pooling_glue: vllm_embed (since ABI 1.3), vLLM's LLM.embed
(vllm/entrypoints/pooling/offline.py) for C callers, over the engine session's
pooling_params and embed (engine/session/embed.py). Two-call sizing: the vector size is
known before anything runs (the hidden size, or `dimensions`), so a sizing call runs no
model.
"""

from __future__ import annotations

from _libvllm import ffi

from libvllm.capi.plumbing import BufferTooSmallError, engines, export
from libvllm.engine.session import InvalidArgumentError


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


@export
def glue_embed(key, texts, text_lens, token_ids, n_token_ids, n_inputs, dimensions, out,
               capacity, n_floats, dim) -> None:
    session = engines.get_live(key).session
    session.require_pooling()
    prompts = _inputs(texts, text_lens, token_ids, n_token_ids, n_inputs)
    params, size = session.pooling_params(dimensions or None)
    dim[0], n_floats[0] = size, size * n_inputs
    if capacity < size * n_inputs:
        raise BufferTooSmallError(f"{n_inputs} vectors of {size} floats do not fit in "
                                  f"capacity {capacity}")
    for i, vector in enumerate(session.embed(prompts, params)):
        out[i * size:(i + 1) * size] = vector
