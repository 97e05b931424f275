"""capi.caller_driven: the caller-driven request functions of include/vllm.h
(vllm_request_add, vllm_request_abort, vllm_engine_step, vllm_engine_num_unfinished).

The engine session (engine/session/) adds, steps and routes each output to the thread
that added its request; this module builds the calling thread's vllm_request_output
array. That array and its strings live until the thread's next step (or the engine's
free), so one thread's step never frees what another reads.
"""

from __future__ import annotations

import threading

from _libvllm import ffi

from libvllm.capi import streams, typed_outputs
from libvllm.capi.generation_defaults import apply_generation_config
from libvllm.capi.plumbing import (
    FINISH_REASONS,
    engines,
    export,
    prompt_arg,
    sampling_params,
    text,
)
from libvllm.engine.session import RoutedOutput

_EMPTY = ffi.new("char[]", b"")


@export
def glue_request_add(key, request_id, prompt, prompt_token_ids, n_prompt_token_ids, params):
    session = engines.get_live(key).session
    rid = text(request_id, "request_id")
    apply_generation_config(params, session.default_sampling_params)
    session.add_request(rid, prompt_arg(prompt, prompt_token_ids, n_prompt_token_ids),
                        sampling_params(params))


@export
def glue_request_abort(key, request_id) -> None:
    engines.get_live(key).session.abort_request(text(request_id, "request_id"))


def _outputs_array(outputs: list[RoutedOutput]) -> tuple[object, list]:
    """A vllm_request_output array of a step's outputs, and every cdata it points into."""
    array = ffi.new("vllm_request_output[]", len(outputs))
    memory = [array]
    for out, routed in zip(array, outputs):
        result, completion = routed.result, routed.completion
        typed_outputs.fill(out, completion, routed.first_token_latency, routed.times,
                           routed.last, memory)
        rid = ffi.new("char[]", result.request_id.encode("utf-8"))
        delta = ffi.new("char[]", completion.text.encode("utf-8", "replace"))
        ids = ffi.new("int32_t[]", completion.token_ids)
        memory += [rid, delta, ids]
        out.request_id, out.text = rid, delta
        out.token_ids, out.n_token_ids = ids, len(completion.token_ids)
        out.finished = int(routed.last)
        out.finish_reason = FINISH_REASONS[completion.finish_reason]
        out.num_prompt_tokens = len(result.prompt_token_ids)
        out.num_output_tokens = routed.num_output_tokens
        out.status, out.error = streams.error_status(result.error), _EMPTY
        if result.error is not None:  # the owner kept, not the pointer read back
            message = ffi.new("char[]", streams.error_message(result.error))
            memory.append(message)
            out.error = message
    return array, memory


@export
def glue_engine_step(key, outputs, n_outputs) -> None:
    handle = engines.get_live(key)
    handle.session.require_caller_driven("vllm_engine_step")
    handle.step_memory.pop(threading.get_ident(), None)  # this thread's previous outputs
    mine = handle.session.step()
    if mine:
        array, handle.step_memory[threading.get_ident()] = _outputs_array(mine)
        outputs[0], n_outputs[0] = array, len(mine)


@export
def glue_engine_num_unfinished(key, n) -> None:
    n[0] = engines.get_live(key).session.num_unfinished()
